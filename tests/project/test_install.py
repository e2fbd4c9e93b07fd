"""What the README's one install command brings: paramiko, so that a job on
remote hosts runs after it, with no extra to name."""

from __future__ import annotations

import configparser
import os
import re

from helpers import REPO


def test_paramiko_is_a_dependency_and_the_readme_names_no_ssh_extra():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO, "setup.cfg"))
    required = [line.strip() for line in cfg["options"]["install_requires"].splitlines()
                if line.strip()]
    assert any(re.match(r"paramiko\b", r) for r in required), required
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    first = re.search(r"```sh\n(.*?)\n```", readme, re.S)
    assert first and "pip install" in first.group(1) and "ssh" not in first.group(1)
    assert "mslaunch[ssh]" not in readme
