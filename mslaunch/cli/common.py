"""Pieces shared by the command-line dialects."""

from __future__ import annotations


class Exit(Exception):
    """Raised by --help and --version: text to print and a status."""

    def __init__(self, text: str, status: int) -> None:
        super().__init__(text)
        self.text = text
        self.status = status


def launch_dir() -> str:
    """The directory mslaunch runs in; one clear error if it was deleted."""
    import os
    try:
        return os.getcwd()
    except FileNotFoundError:
        from ..errors import LaunchError
        raise LaunchError("the current directory no longer exists (it was deleted after "
                          "the shell entered it); cd to an existing directory") from None
