"""mslaunch: a fast, trustworthy launcher for MPI and distributed jobs.

The package is a pipeline, one subpackage per stage: ``cli`` parses the
command line into a ``spec.JobSpec``; ``hosts`` reads host lists; ``plan``
places ranks and builds each rank's environment (pure); ``run`` starts,
supervises and relays the ranks and guards against orphans; ``pmi`` serves
the PMI wire protocol beside the supervisor; ``ompi`` delegates to Open MPI.
"""

__version__ = "0.1.0"
