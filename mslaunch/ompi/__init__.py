"""Open MPI support: ``--mpi openmpi`` delegates the job to a real Open MPI mpirun.

See :mod:`.delegate`.  The rank wrapper that maps Open MPI's (and PMI's and
Slurm's) rank variables to MindSpore's and PyTorch's is
:mod:`mslaunch.rankenv`.
"""
