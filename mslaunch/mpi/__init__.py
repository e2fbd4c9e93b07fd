"""The MPI services a host gives its ranks: MPICH's PMI (:mod:`.pmi`), Open
MPI's PMIx (:mod:`.pmix`), Open MPI's MCA parameter files (:mod:`.mcafile`);
and, in :mod:`.serve`, how a job's MPI is served across its hosts."""
