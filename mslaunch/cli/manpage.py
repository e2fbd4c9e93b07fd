"""``mslaunch(1)``, the man page, made from the option records of :mod:`.options`
(as ``--help`` is), and the pages of ``mslaunch-top(1)`` and
``mslaunch-stacks(1)``, made from their usage texts: ``man/*.1`` in the
repository are this module's pages (``scripts/options_table.py`` writes them)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List

from .. import __version__


def _roff(text: str) -> str:
    """Text safe in a man page: backslashes and leading dots and quotes escaped,
    every dash a minus (options are typed, not hyphenated)."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + line if line.startswith((".", "'")) else line)
                     for line in text.split("\n"))


def man_page() -> str:
    """The page, in man(7) macros."""
    from .help import _DEEPSPEED, _MSRUN, _PROSE, _TORCHRUN
    from .options import SECTIONS
    out: List[str] = [
        f'.TH MSLAUNCH 1 "" "mslaunch {__version__}" "User Commands"',
        ".SH NAME",
        "mslaunch \\- a fast, trustworthy launcher for MPI and distributed jobs",
        ".SH SYNOPSIS",
        ".B mslaunch",
        "[\\fIoptions\\fR] \\fIprogram\\fR [\\fIargs\\fR...] [: [\\fIoptions\\fR] "
        "\\fIprogram2\\fR [\\fIargs\\fR...]]",
        ".br",
        ".B mslaunch",
        "\\-\\-worker_num=\\fIN\\fR \\-\\-local_worker_num=\\fIM\\fR [\\fImsrun options\\fR] "
        "\\fIscript\\fR [\\fIargs\\fR...]",
        ".br",
        ".B mslaunch",
        "\\-\\-nproc\\-per\\-node=\\fIN\\fR [\\fItorchrun options\\fR] \\fIscript\\fR "
        "[\\fIargs\\fR...]",
        ".br",
        ".B mslaunch",
        "\\-\\-num_gpus=\\fIN\\fR [\\fIDeepSpeed options\\fR] \\fIscript\\fR "
        "[\\fIargs\\fR...]",
        ".SH DESCRIPTION",
        _roff("A drop-in for mpirun (Open MPI 4/5 and MPICH Hydra spellings), for "
              "MindSpore's msrun, for torchrun (and torch.distributed.launch) and for "
              "DeepSpeed's launcher: replace the launcher's name by mslaunch "
              "and the same job runs, on this machine or on remote hosts (SSH, an rsh "
              "agent, Slurm, PBS, Grid Engine, LSF). mslaunch serves PMI and PMIx itself, "
              "stops the whole job at the first failure with that rank's exit status, "
              "and leaves no process behind."),
        ".SH OPTIONS",
    ]
    for title, options in SECTIONS:
        if not title:
            continue
        out.append(f".SS {_roff(title)}")
        before, after = _PROSE.get(title, ("", ""))
        for entry in [before, *(option.help for option in options), after]:
            if not entry:
                continue
            left, tab, right = entry.partition("\t")
            if tab:
                out += [".TP", f".B {_roff(left)}", _roff(" ".join(right.split("\n")))]
            else:
                out += [".PP", _roff(entry)]
    for title, text in (("MSRUN DIALECT", _MSRUN), ("TORCHRUN DIALECT", _TORCHRUN),
                        ("DEEPSPEED DIALECT", _DEEPSPEED)):
        out += [f".SH {title}", ".nf", _roff(text.rstrip("\n")), ".fi"]
    out += [
        ".SH EXIT STATUS",
        _roff("0 when every rank succeeded; else the exit status of the rank that failed "
              "first, or 128+N for a rank killed by signal N; 2 for a bad command line; "
              "110 for --timeout; 111 for --stall-exit; 255 for a lost host; 130, 143, 129 "
              "when mslaunch was stopped by SIGINT, SIGTERM, SIGHUP."),
        ".SH SEE ALSO",
        "\\fBmslaunch\\-stacks\\fR [\\fIJOB\\fR], \\fBmslaunch\\-top\\fR [\\fIJOB\\fR]: "
        "every rank's stacks and a live view of a running job;",
        _roff("the guides and references under docs/ of mslaunch's repository."),
    ]
    return "\n".join(out) + "\n"


def tool_page(name: str) -> str:
    """The page of ``mslaunch-top`` or ``mslaunch-stacks``, from its usage text."""
    from importlib import import_module
    module = import_module(f"mslaunch.cli.{name.split('-')[1]}")
    usage: str = module.USAGE
    summary = (module.__doc__ or "").split("\n\n", 1)
    synopsis, _, rest = usage.partition("\n\n")
    out = [f'.TH {name.upper()} 1 "" "mslaunch {__version__}" "User Commands"',
           ".SH NAME", f"{_roff(name)} \\- {_roff(summary[0].split(':', 1)[1].strip())}",
           ".SH SYNOPSIS", ".nf", _roff(synopsis.replace("usage: ", "")), ".fi",
           ".SH DESCRIPTION",
           _roff(" ".join(summary[1].replace("``", "").split()) if len(summary) > 1 else ""),
           ".SH OPTIONS", ".nf", _roff(rest.rstrip("\n")), ".fi",
           ".SH SEE ALSO", "\\fBmslaunch\\fR(1)"]
    return "\n".join(out) + "\n"
