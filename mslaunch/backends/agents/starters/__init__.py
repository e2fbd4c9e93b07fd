"""What starts the agents, behind one seam (:mod:`.starter`): paramiko's SSH
(:mod:`.ssh`), any rsh agent (:mod:`.rsh`), srun (:mod:`.slurm`); the last two
dial back (:mod:`.dialin`)."""
