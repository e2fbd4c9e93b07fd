"""``--mpi openmpi``: the job runs under the user's own Open MPI mpirun."""
