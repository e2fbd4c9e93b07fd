"""The starter of agents over SSH with paramiko (see :mod:`.starter`).

Up to :data:`.helpers.MIN_HOSTS` hosts, the launcher connects to
every host itself (:func:`~mslaunch.backends.agents.starters.ssh.connect.connect_all`); from there on, helper
processes do (:mod:`.helpers`), forked as soon as the hosts are known.
"""

from __future__ import annotations

import os
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

    from .....core.spec import SSHSpec

from .....core.errors import HostsFailed
from ... import bootstrap
from .paramiko_import import import_finished, start_import
from .connect import Options, close_all, connect_all
from .helpers import Helpers, helper_count


def make(spec: SSHSpec, environ: Mapping[str, str], pythons: Sequence[str],
         port_range: Optional[Tuple[int, int]]) -> SSHStarter:
    """The agents of a job whose hosts are reached over SSH, with paramiko."""
    return SSHStarter(spec, pythons, environ)


class SSHStarter:
    """The :class:`~..starter.Starter` that starts agents over SSH with paramiko:
    inside the launcher, or from :data:`.helpers.MIN_HOSTS` hosts on
    in helper processes (:mod:`.helpers`), forked as soon as the hosts are
    known."""

    plain_link = False        # the links travel in SSH channels
    first_phase = "SSH: connecting"
    spares_later = True

    def __init__(self, spec: SSHSpec, pythons: Sequence[str],
                 environ: Optional[Mapping[str, str]] = None) -> None:
        self.environ = os.environ if environ is None else environ
        self.options = Options(config=spec.config, user=spec.user, port=spec.port,
                               identity=spec.identity, accept_new=spec.accept_new,
                               connect_timeout=spec.connect_timeout, pythons=pythons,
                               wrapper=spec.agent_wrapper)
        self.helpers = Helpers(self.options)
        self._begun: List[str] = []        # hosts the helpers are starting since prepare

    @property
    def begun(self) -> bool:
        return bool(self._begun)

    def prepare(self, names: Sequence[str] = (), job: str = "") -> None:
        """Helpers that start the agents at once, or paramiko's import and the
        agent's package in the background."""
        count = helper_count(len(names), self.environ)
        if count:
            # Forked first: no thread of this process is importing or building yet.
            bootstrap.name_job(job)
            self._fork(names, count)
            self._begun = list(names)
            return
        start_import()
        bootstrap.prepare_in_background(import_finished, job=job)

    def close(self) -> None:
        """The helper processes, if any, end (their agents ended before)."""
        self._begun = []
        self.helpers.end()

    def start(self, names: Sequence[str], *, cancelled: Optional[Callable[[], bool]] = None,
              say: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
        begun, self._begun = self._begun, []
        count = self.helpers.count if begun else helper_count(len(names), self.environ)
        if not begun and threading.current_thread() is not threading.main_thread():
            # The spares, started beside the running job: a fork now could copy
            # a lock another thread holds, so they connect from here.
            count = 0
        if say is not None:
            by = f" in {count} helper process(es)" if count else ""
            say(f"mslaunch: starting agents on {len(names)} remote host(s) over SSH{by}")
        if not count:
            return connect_all(names, self.options, cancelled=cancelled)
        if not begun:
            import_finished()          # no import, no package build under way
            bootstrap.prepared()
            self._fork(names, count)
            begun = list(names)
        failed: Optional[HostsFailed] = None
        try:
            conns: Dict[str, Any] = dict(self.helpers.collect(cancelled))
        except HostsFailed as err:
            failed, conns = err, err.started
        for name in [n for n in conns if n not in names]:
            _let_go(conns.pop(name))
        rest = [n for n in names if n not in begun]
        if rest:        # asked for, not prepared: started here
            try:
                conns.update(connect_all(rest, self.options, cancelled=cancelled))
            except HostsFailed as err:
                conns.update(err.started)
                failed = _merged(failed, err, len(names))
            except BaseException:
                close_all(conns)
                raise
        if failed is not None:
            failed.started = conns
            raise failed
        return conns


    def _fork(self, names: Sequence[str], count: int) -> None:
        # The helpers inherit this process's limit of open files: about three
        # descriptors per host there, and two more here.
        from .....machine.spawn import raise_fd_limit
        raise_fd_limit(8 * len(names) + 64)
        self.helpers.begin(names, count)


def _merged(first: Optional[HostsFailed], second: HostsFailed, total: int) -> HostsFailed:
    """Hosts that failed in the helpers and here, as one failure."""
    if first is None:
        return second
    failed = dict(first.failed, **second.failed)
    return HostsFailed(f"cannot start the job's agent on {len(failed)} of {total} remote "
                       f"host(s): {first} / {second}", failed,
                       unreachable=first.unreachable + second.unreachable)


def _let_go(conn: Any) -> None:
    """An agent started for a host the job no longer asks for: ``BYE`` (it exits 0)."""
    from .....wire import link
    try:
        os.write(conn.fd, link.encode(link.BYE))
    except OSError:
        pass
    close_all({conn.name: conn})
