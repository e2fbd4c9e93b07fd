"""How a job's MPI is served across its hosts: the launcher's set of PMI jobs
(the first and those it spawns, :mod:`.mpijobs`), its PMIx side
(:mod:`.pmixjobs`), an agent's part of PMI (:mod:`.agentpmi`) and PMIx's
direct modex over the link (:mod:`.modex`)."""
