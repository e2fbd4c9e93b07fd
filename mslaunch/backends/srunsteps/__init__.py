"""``--launcher srun``: one srun step runs every rank, with no agent."""
