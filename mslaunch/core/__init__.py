"""What every layer stands on: the job's records (:mod:`.spec`), the one
exception tree (:mod:`.errors`), the named states (:mod:`.states`), the
switches read from the environment (:mod:`.switches`), and small pure modules
(the CPU topology, the process map, the MCA log lines)."""
