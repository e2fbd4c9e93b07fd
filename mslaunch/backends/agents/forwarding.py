"""Telling, once, which of the launcher's variables remote ranks will not get.

Under Open MPI's rule, which mslaunch keeps for its spellings, a remote rank
gets its host's login environment and only the variables ``-x`` names (Hydra's
spellings, and ``-genvall``, forward the launcher's whole environment).  A job
moved from this machine to several hosts then loses variables without a word.
So when a job's remote ranks run under that rule and its command line names no
variable with ``-x``, the variables set here that a login session does not
set itself are named once, with how to send them; the names told are kept in
the per-user cache, and a later job says only the names not told before (a
note repeated with every job would be noise).  It is said to a person: only
when mslaunch's stderr is a terminal (a batch job's log, where nobody moves a
job by hand, does not get it); ``-q`` leaves it out.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterable, List, Mapping, Set

    from ...core.spec import JobSpec

#: Variables every login session sets for itself, or that belong to this
#: terminal, this session or a launcher: never worth sending.
SESSION = frozenset((
    "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "SHLVL", "TERM", "LANG", "LANGUAGE",
    "MAIL", "HOSTNAME", "HOST", "_", "DISPLAY", "COLORTERM", "LS_COLORS", "LESSOPEN",
    "LESSCLOSE", "PAGER", "EDITOR", "VISUAL", "PS1", "PS2", "PROMPT_COMMAND", "STY", "WINDOW",
    "MOTD_SHOWN", "PATH", "MANPATH", "INFOPATH", "TZ", "HISTSIZE", "HISTFILESIZE",
    "HISTCONTROL", "TMPDIR", "PYTHONUNBUFFERED", "OLDPWD"))
SESSION_PREFIXES = ("LC_", "SSH_", "XDG_", "DBUS_", "TMUX", "TERM_", "KITTY_", "VTE_",
                    "WSL", "GPG_", "MSLAUNCH_", "OMPI_", "PMI_", "PMIX_", "HYDRA_", "SLURM_",
                    "PBS_", "SGE_", "LSB_", "MPIEXEC_", "I_MPI_", "BASH_FUNC_")
#: Names said at most in the note (the rest counted).
SHOWN = 10
_FILE = "told-forwarding"


def worth_sending(environ: Mapping[str, str]) -> List[str]:
    """The launcher's variables a remote login session would not have, sorted."""
    return sorted(name for name in environ if name not in SESSION
                  and not name.startswith(SESSION_PREFIXES))


def applies(job: JobSpec) -> bool:
    """Whether remote ranks run under Open MPI's rule with nothing named by ``-x``."""
    return (job.inherit_env and not job.forward_env and not job.quiet and not job.global_env
            and not any(app.env for app in job.apps))


def tell_once(job: JobSpec, environ: Mapping[str, str], say: Callable[[str], None],
              cache: Callable[[str], str]) -> None:
    """Say the note for the names not told before (``cache`` names the file)."""
    if not applies(job):
        return
    names = worth_sending(environ)
    path = cache(_FILE)
    told = _told(path)
    new = [n for n in names if n not in told]
    if not new:
        return
    more = f" and {len(new) - SHOWN} more" if len(new) > SHOWN else ""
    say(f"mslaunch: note: remote ranks get their host's login environment and only what -x "
        f"names (Open MPI's rule), so not {', '.join(new[:SHOWN])}{more}, set here; send "
        f"one with -x NAME, or all of this environment with -genvall (said once for "
        f"these names)")
    _remember(path, told | set(new))


def _told(path: str) -> Set[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return set(f.read().split())
    except OSError:
        return set()


def _remember(path: str, names: Iterable[str]) -> None:
    from ...machine.osfiles import write_whole
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_whole(path, "\n".join(sorted(names)).encode() + b"\n", shared=True)
    except OSError:
        pass            # told again next time: nothing lost
