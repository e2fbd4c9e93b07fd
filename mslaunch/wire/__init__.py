"""The link between the launcher and its agents, the same at both ends: its
frames (:mod:`.link`) and their JSON (:mod:`.wirejson`), the endpoint that
reads and writes them (:mod:`.endpoint`), the job frame (:mod:`.jobframe`),
the connections an agent dials back (:mod:`.dialback`) and the splicing of
output into them (:mod:`.splice`)."""
