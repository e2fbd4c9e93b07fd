"""The job: the policy on top of every mechanism.

:mod:`.launch` ties hosts, plan and supervision together; :mod:`.supervise`
is the policy (who failed first, stopping, signals, timeouts, exit status);
:mod:`.fleet` brings the remote hosts up through the job's starter;
:mod:`.report` says what a job that did not simply succeed tells the user;
:mod:`.mpijobs` is the PMI job set of a run (the first job and those it
spawns); :mod:`.openmpi` is the Open MPI-backed mode (``--mpi openmpi``);
:mod:`.seams` names, for type checkers only, what these use of each other.
"""
