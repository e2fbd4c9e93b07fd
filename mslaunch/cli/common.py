"""Pieces shared by the command-line dialects."""

from __future__ import annotations


class Exit(Exception):
    """Raised by --help and --version: text to print and a status."""

    def __init__(self, text: str, status: int) -> None:
        super().__init__(text)
        self.text = text
        self.status = status
