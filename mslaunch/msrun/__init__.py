"""msrun mode: MindSpore's launcher's command lines, run by mslaunch.

The dialect is read by :mod:`mslaunch.cli.msrun`; :mod:`.plan` makes one
node's processes (scheduler and workers, msrun's environment and log
names); :mod:`.node` runs them under the common supervisor, joined with
the other nodes through the authenticated :mod:`.service` (:mod:`.secret`,
:mod:`.tls`); :mod:`.record` keeps the detached job of ``--join=False``.
"""
