"""The README is a front door and the docs beside it hold together.

The README stays short, keeps exactly its two set-up commands (the second is
what .ci/run runs), and every file it links to exists; the pages under docs/
build with mkdocs in strict mode, in which a broken link, a missing anchor or
a page left out of the navigation fails the build -- shown here on a copy
with each kind of fault.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from requires import require
from helpers import REPO

README = os.path.join(REPO, "README.md")
#: a Markdown link or image: [text](target) with no space in the target
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (mkdocs) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(markdown: str) -> set:
    text = FENCE.sub("", markdown)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(path: str) -> list:
    """The relative links of a Markdown file outside docs/ whose file (or
    heading anchor, in a Markdown file) does not exist."""
    base = os.path.dirname(path)
    bad = []
    for target in LINK.findall(FENCE.sub("", read(path))):
        if re.match(r"[a-z]+:", target):
            continue                       # http:, mailto: -- not ours to check
        name, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(base, name)) if name else path
        if not os.path.exists(full):
            bad.append(target)
        elif anchor and full.endswith(".md") and anchor not in anchors(read(full)):
            bad.append(target)
    return bad


def mkdocs() -> list:
    found = shutil.which("mkdocs", path=os.path.dirname(sys.executable))
    require(found is not None, "mkdocs (pip install '.[test]')")
    return [sys.executable, "-m", "mkdocs"]


def build(root: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([*mkdocs(), "build", "--strict", "-f",
                           os.path.join(root, "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          capture_output=True, text=True, timeout=120, cwd=root)


# -- the README ------------------------------------------------------------------

def test_the_readme_is_at_most_400_lines():
    assert read(README).count("\n") <= 400


def test_the_readme_keeps_exactly_two_setup_commands_and_ci_runs_the_second():
    # A set-up command installs something or runs the tests: the demo's one
    # line, then the suite's.
    setup = [body.strip() for lang, body in FENCE.findall(read(README))
             if lang == "sh" and re.search(r"pip install|venv|apt-get|scripts/test\.sh", body)]
    assert len(setup) == 2, setup
    demo, tests = setup
    # one line: a virtual environment, the package with MPI, the demo job, its log
    assert "\n" not in demo and demo.startswith("python3 -m venv ")
    assert "pip install" in demo and "scripts/run_single.sh" in demo
    assert tests == "bash scripts/test.sh"
    ci = read(os.path.join(REPO, ".ci", "run"))
    assert re.search(r"^" + re.escape(tests) + r"$", ci, re.M), ci


def test_every_link_of_the_readme_and_contributing_resolves():
    for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md"):
        assert broken_links(os.path.join(REPO, name)) == [], name
    assert "docs/guides/remote-hosts.md" in LINK.findall(read(README))


def test_the_readme_and_the_docs_home_link_every_guide():
    guides = sorted(f for f in os.listdir(os.path.join(REPO, "docs", "guides"))
                    if f.endswith(".md"))
    readme = {os.path.basename(t.partition("#")[0]) for t in LINK.findall(read(README))
              if t.startswith("docs/guides/")}
    home = {os.path.basename(t.partition("#")[0])
            for t in LINK.findall(read(os.path.join(REPO, "docs", "index.md")))
            if t.startswith("guides/")}
    assert [g for g in guides if g not in readme] == []
    assert [g for g in guides if g not in home] == []


def test_the_readme_names_every_package_the_test_command_installs():
    # what scripts/test.sh installs with apt, said before it runs
    script = read(os.path.join(REPO, "scripts", "test.sh"))
    packages = {p for group in re.findall(r"apt_needed\+=\(([^)]*)\)", script)
                for p in group.split()}
    assert {"gcc", "openssh-server", "slurm-wlm", "groff-base", "man-db", "zsh"} <= packages
    assert re.search(r'apt-get install .*"python\$1" "python\$1-venv"', script, re.S)
    readme = read(README)
    named = set(re.findall(r"`([\w.+-]+)`", readme))
    assert sorted(packages - named) == []
    assert {"pythonX.Y", "pythonX.Y-venv"} <= named


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## The `--x` flag\n")
    page = tmp_path / "README.md"
    page.write_text("[ok](docs/page.md) [ok](docs/page.md#the-x-flag) [web](https://a.b/c)\n"
                    "```sh\n[not a link](nowhere.md)\n```\n"
                    "[gone](docs/gone.md) [no such part](docs/page.md#nowhere)\n")
    assert broken_links(str(page)) == ["docs/gone.md", "docs/page.md#nowhere"]


# -- the docs site -----------------------------------------------------------------

def test_the_docs_build_strictly(tmp_path):
    r = build(REPO, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "site" / "reference" / "options" / "index.html").exists()


@pytest.mark.parametrize("fault, page, text, says", [
    ("a link to a page that does not exist", "guides/slurm.md",
     "\nSee [the missing page](nowhere.md).\n", "nowhere.md"),
    ("a link to a heading that does not exist", "reference/failures.md",
     "\nSee [output](output.md#no-such-heading).\n", "no-such-heading"),
    ("a page left out of the navigation", "guides/unlisted.md",
     "# Unlisted\n", "unlisted.md"),
])
def test_a_broken_reference_fails_the_build(tmp_path, fault, page, text, says):
    root = tmp_path / "copy"
    shutil.copytree(os.path.join(REPO, "docs"), root / "docs")
    shutil.copy(os.path.join(REPO, "mkdocs.yml"), root / "mkdocs.yml")
    assert build(str(root), tmp_path / "good").returncode == 0
    with open(root / "docs" / page, "a") as f:
        f.write(text)
    r = build(str(root), tmp_path / "bad")
    assert r.returncode != 0, fault
    assert says in r.stderr, r.stderr


def test_every_page_of_the_docs_is_in_the_navigation():
    listed = set(re.findall(r":\s*(\S+\.md)\s*$", read(os.path.join(REPO, "mkdocs.yml")), re.M))
    pages = {os.path.relpath(os.path.join(d, f), os.path.join(REPO, "docs"))
             for d, _, files in os.walk(os.path.join(REPO, "docs")) for f in files
             if f.endswith(".md")}
    assert pages == listed


def test_the_readme_s_package_size_is_what_an_agent_is_sent():
    from mslaunch.backends.agents.bootstrap import framed_bundle
    with open(os.path.join(REPO, "README.md")) as f:
        said = re.search(r"sends its package \(about ([\d.]+) MiB", f.read())
    assert said, "README.md names the package's size"
    sent = len(framed_bundle()) / 2**20
    assert abs(float(said.group(1)) - sent) < 0.1, f"the package is {sent:.2f} MiB"
