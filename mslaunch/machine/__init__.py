"""The mechanisms of one machine, which the launcher and every host's agent stand on.

No policy and no MPI here: the :mod:`.loop` (epoll, timers), :mod:`.spawn`
(``posix_spawn`` of one rank; :mod:`.spawndir` for one in a working directory
other than the launcher's), :mod:`.local` (ranks on this machine: start,
exits through pidfds, leftovers), :mod:`.terminal` (mslaunch's stdout and
stderr, never blocking), :mod:`.output` (rank sinks, pipe readers),
:mod:`.stdin` (the launcher's stdin to the ranks), :mod:`.guard` (the orphan
guard, and the job's private control socket; its MPI clean-up is a hook its
owner passes in), :mod:`.procs` (finding and stopping processes),
:mod:`.stacks` (every rank's stacks, read without stopping it: :mod:`.pydump`
for Python frames, :mod:`.mainthread` for a main thread's own, :mod:`.native`
for native ones) and :mod:`.topology` (this
machine's cores from sysfs, the per-user cache).
"""
