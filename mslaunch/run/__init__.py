"""Running a job: spawn ranks, supervise them, relay their output, guard against orphans.

:mod:`.launch` ties the stages together; :mod:`.spawn` starts local ranks;
:mod:`.supervise` watches them on the :mod:`.loop` event loop and applies the
abort policy; :mod:`.output` relays their streams; :mod:`.guard` makes sure
nothing outlives the job.
"""
