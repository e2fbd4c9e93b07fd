"""The job: the policy on top of every mechanism.

:mod:`.launch` ties hosts, plan and supervision together; :mod:`.supervise`
is the policy (who failed first, stopping, signals, timeouts, exit status);
:mod:`.mpijobs` is the PMI job set of a run (the first job and those it
spawns); :mod:`.openmpi` is the Open MPI-backed mode (``--mpi openmpi``).
"""
