"""mslaunch: a fast, trustworthy launcher for MPI and distributed jobs.

The package is a pipeline: ``cli`` parses the command line into a
``spec.JobSpec``; ``hostfile`` reads host lists; ``plan`` places ranks and
builds each rank's environment (pure); ``spawn`` starts local processes;
``supervise`` watches them (exits, abort policy, signals, timeouts) with
``output`` relaying their streams; ``pmi`` serves the PMI wire protocol
beside the supervisor.  ``launch`` ties the stages together.
"""

__version__ = "0.1.0"
