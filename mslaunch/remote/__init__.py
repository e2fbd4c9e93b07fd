"""Remote hosts: the per-host agent and everything that reaches it.

The launcher connects over SSH (:mod:`.ssh`), sends the bootstrap and its
own package (:mod:`.bootstrap`), and then talks to the :mod:`.agent` over a
framed link (:mod:`.link`, :mod:`.endpoint`).  On the launcher's side each
host is a :class:`~.host.RemoteHost`, behind the same seam as the local
ranks.
"""
