"""The ways a job's ranks start, behind one seam (:mod:`.backend`), and the
registry that picks one: this machine's processes, agents on remote hosts
(:mod:`.agents`, their starters inside), one srun step with no agent
(:mod:`.srunsteps`), Open MPI's own mpirun (:mod:`.mpirun`), one node of a job
run one command per node (:mod:`.nodes`)."""
