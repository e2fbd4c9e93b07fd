"""``mslaunch --completion bash|zsh``: a shell's completion script, as pip's
``pip completion`` prints one: every dialect's option names (from
:mod:`.options` and the other dialects' tables); after ``-H``/``--host`` the
hosts your SSH config and ``known_hosts`` name (read when you press Tab, the
part after the last comma of a list); after ``--map-by``, ``--bind-to`` and
``--rank-by`` their values; files elsewhere.

Installed once by ``mslaunch --completion bash >
~/.local/share/bash-completion/completions/mslaunch`` (bash-completion loads it
when ``mslaunch`` is first completed), or for zsh into a directory of
``$fpath`` as ``_mslaunch``; ``source <(mslaunch --completion bash)`` for one
shell.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Sequence

#: Options followed by a host list.
HOST_OPTIONS = ("-H", "--host", "-host", "--hosts", "-hosts")

# The hosts of ~/.ssh/config (Host lines, no patterns) and of known_hosts (names
# not hashed; [name]:port as name), one a line: the same commands for both shells,
# each file read by an awk of its own (mawk stops at the first file it cannot open).
_HOSTS = ("{ awk 'tolower($1)==\"host\"{for(i=2;i<=NF;i++)if($i!~/[*?!]/)print $i}' "
          "~/.ssh/config; awk '$1!~/^[|@#]/{n=split($1,a,\",\");for(i=1;i<=n;i++)"
          "{h=a[i];gsub(/^\\[|\\]:[0-9]+$/,\"\",h);print h}}' ~/.ssh/known_hosts; } "
          "2>/dev/null | sort -u")


def values() -> Dict[str, str]:
    """The values completed after an option, by option (space-separated)."""
    from .mapping import BIND_POLICIES, MAP_POLICIES, RANK_POLICIES
    by = {"--map-by": MAP_POLICIES + ("ppr:",), "--bind-to": BIND_POLICIES,
          "--rank-by": RANK_POLICIES, "--completion": ("bash", "zsh"),
          "--launcher": ("ssh", "rsh", "srun")}
    out = {}
    for option, words in by.items():
        out[option] = out[option[1:]] = " ".join(words)
    return out


def every_option(mpirun: Sequence[str]) -> str:
    """Every dialect's option names: mpirun's spellings, then torchrun's, DeepSpeed's
    and msrun's."""
    from .common import DEEPSPEED_OPTIONS as DEEPSPEED, MSRUN_EXTRAS, MSRUN_OPTIONS, \
        TORCHRUN_OPTIONS
    words = set(mpirun)
    for name, _, _ in TORCHRUN_OPTIONS:
        words.add("--" + name.replace("_", "-"))
    words.update("--" + name for name in (*DEEPSPEED, *MSRUN_OPTIONS, *MSRUN_EXTRAS))
    return " ".join(sorted(words))


def completion(shell: str, options: Sequence[str]) -> str:
    """The completion script of ``shell`` (bash or zsh) for ``options`` (mpirun's)."""
    words = every_option(options)
    after = values()
    hosts = "|".join(HOST_OPTIONS)
    if shell == "bash":
        return _bash(words, after)
    cases = "".join(f"        {option}) compadd -- {value}; return;;\n"
                    for option, value in sorted(after.items()))
    return (f"#compdef mslaunch\n"
            f"# mslaunch's completion for zsh: mslaunch --completion zsh > DIR/_mslaunch, "
            f"DIR in $fpath\n"
            f"_mslaunch() {{\n"
            f"    case ${{words[CURRENT-1]}} in\n"
            f"        {hosts})\n"
            f"            compset -P '*,'\n"
            f"            compadd -S '' -- ${{(f)\"$({_HOSTS})\"}}; return;;\n"
            f"{cases}"
            f"    esac\n"
            f"    if [[ $PREFIX == -* ]]; then\n"
            f"        compadd -- {words}\n"
            f"    else\n"
            f"        _files\n"
            f"    fi\n"
            f"}}\n"
            f"if [[ $zsh_eval_context[-1] == loadautofunc ]]; then\n"
            f"    _mslaunch \"$@\"\n"
            f"else\n"
            f"    compdef _mslaunch mslaunch\n"
            f"fi\n")


def _bash(words: str, after: Dict[str, str]) -> str:
    """bash's script.  The word is taken from the line itself: bash splits words at
    ':' and '=' too (``COMP_WORDBREAKS``), and replaces only the part after the
    last of them, so that each answer is cut to that part.  Host names are
    compared, never expanded (``compgen -W`` would run a ``$(...)`` among them)."""
    hosts = "|".join(HOST_OPTIONS)
    cases = "".join(f"        {option}) COMPREPLY=( $(compgen -P \"$pre\" -W '{value}' -- "
                    f"\"$value\") );;\n" for option, value in sorted(after.items()))
    return (f"# mslaunch's completion for bash: mslaunch --completion bash > "
            f"~/.local/share/bash-completion/completions/mslaunch\n"
            f"_mslaunch() {{\n"
            f"    local line=${{COMP_LINE:0:COMP_POINT}}\n"
            f"    local cur=${{line##*[[:space:]]}}\n"
            f"    local rest=${{line%\"$cur\"}}\n"
            f"    rest=${{rest%\"${{rest##*[![:space:]]}}\"}}\n"
            f"    local prev=${{rest##*[[:space:]]}} value=$cur pre=\"\" h\n"
            f"    if [[ $cur == -*=* ]]; then prev=${{cur%%=*}} value=${{cur#*=}} "
            f"pre=${{cur%%=*}}=; fi\n"
            f"    COMPREPLY=()\n"
            f"    case $prev in\n"
            f"        {hosts})\n"
            f"            local part=$value\n"
            f"            [[ $value == *,* ]] && pre=$pre${{value%,*}}, part=${{value##*,}}\n"
            f"            while IFS= read -r h; do\n"
            f"                [[ $h == \"$part\"* ]] && COMPREPLY+=(\"$pre$h\")\n"
            f"            done < <({_HOSTS})\n"
            f"            compopt -o nospace 2>/dev/null;;\n"
            f"{cases}"
            f"        *)\n"
            f"            if [[ $cur == -* ]]; then\n"
            f"                COMPREPLY=( $(compgen -W '{words}' -- \"$cur\") )\n"
            f"            else\n"
            f"                COMPREPLY=( $(compgen -f -- \"$cur\") )\n"
            f"            fi;;\n"
            f"    esac\n"
            f"    local keep=${{cur%\"${{cur##*[:=]}}\"}} i\n"
            f"    for i in \"${{!COMPREPLY[@]}}\"; do COMPREPLY[i]=${{COMPREPLY[i]#\"$keep\"}}; done\n"
            f"}}\n"
            f"complete -o default -F _mslaunch mslaunch\n")
