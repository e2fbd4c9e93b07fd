"""``mslaunch --completion bash|zsh``: a shell's completion script of the options,
as pip's ``pip completion`` prints one (the words come from :mod:`.options`)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence


def completion(shell: str, options: Sequence[str]) -> str:
    """The completion script of ``shell`` (bash or zsh) for ``options``."""
    words = " ".join(options)
    if shell == "bash":
        return (f"# mslaunch's completion for bash: source <(mslaunch --completion bash)\n"
                f"_mslaunch() {{\n"
                f"    local cur=${{COMP_WORDS[COMP_CWORD]}}\n"
                f"    if [[ $cur == -* ]]; then\n"
                f"        COMPREPLY=( $(compgen -W '{words}' -- \"$cur\") )\n"
                f"    else\n"
                f"        COMPREPLY=( $(compgen -f -- \"$cur\") )\n"
                f"    fi\n"
                f"}}\n"
                f"complete -o default -F _mslaunch mslaunch\n")
    return (f"#compdef mslaunch\n"
            f"# mslaunch's completion for zsh: source <(mslaunch --completion zsh)\n"
            f"_mslaunch() {{\n"
            f"    if [[ $PREFIX == -* ]]; then\n"
            f"        compadd -- {words}\n"
            f"    else\n"
            f"        _files\n"
            f"    fi\n"
            f"}}\n"
            f"compdef _mslaunch mslaunch\n")
