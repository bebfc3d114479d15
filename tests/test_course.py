"""A course in a box: licences, citation, package metadata, package data, Binder's and students'
environments (issue #25 points 1-2, #21 point 1). The heavy checks, a wheel installed into a
fresh venv, are in tests/test_wheel.py."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

import flashlab
import flashlab.data

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


# -- licences -----------------------------------------------------------------------------------

def test_code_is_mit_and_text_is_cc_by_4():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    text = (ROOT / "LICENSE-TEXT").read_text()
    # the full legal code, not a pointer to it
    assert "Creative Commons Attribution 4.0 International Public License" in text
    assert "Section 8 -- Interpretation." in text and len(text) > 15000


def test_both_licences_are_named_in_readme_pyproject_and_book_footer():
    readme = (ROOT / "README.md").read_text()
    assert "LICENSE-TEXT" in readme and "CC BY 4.0" in readme and "MIT" in readme
    project = PYPROJECT["project"]
    assert project["license"] == "MIT"
    assert set(project["license-files"]) == {"LICENSE", "LICENSE-TEXT"}
    footer = yaml.safe_load((ROOT / "_config.yml").read_text())["html"]["extra_footer"]
    assert "CC BY 4.0" in footer and "MIT" in footer


def test_citation_cff_has_the_required_fields_and_the_package_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    # required keys of the Citation File Format 1.2.0 schema
    for key in ("cff-version", "message", "title", "authors"):
        assert cff.get(key), key
    assert cff["cff-version"] == "1.2.0"
    assert all(isinstance(a, dict) and (a.get("name") or a.get("family-names")) for a in cff["authors"])
    assert str(cff["version"]) == flashlab.__version__
    assert set(cff["license"]) == {"MIT", "CC-BY-4.0"}
    assert cff["repository-code"] == yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"]


# -- pyproject --------------------------------------------------------------------------------

def test_pyproject_has_full_metadata_and_one_version_source():
    project = PYPROJECT["project"]
    for key in ("description", "readme", "license", "authors", "urls", "classifiers", "keywords"):
        assert project.get(key), key
    assert "version" not in project and project["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "flashlab.__version__"}
    # PEP 639 (license expression, license-files) needs setuptools >= 77
    (req,) = PYPROJECT["build-system"]["requires"]
    assert re.fullmatch(r"setuptools>=77(\.\d+)*,<\d+", req), req


def _pin(requirement: str) -> tuple[str, str]:
    name, version = requirement.split("==")
    return name.strip().lower().replace("_", "-"), version.strip()


def test_numba_is_bounded_to_the_tested_minor_series():
    """kernels/blas.py uses numba.np.linalg._BLAS (private): the range must hold the pinned numba
    and stop before the next minor release."""
    deps = {re.split(r"[<>=!~ ]", d, maxsplit=1)[0].lower(): d for d in PYPROJECT["project"]["dependencies"]}
    pins = dict(_pin(line) for line in (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    major, minor = pins["numba"].split(".")[:2]
    assert deps["numba"] == f"numba>={major}.{minor},<{major}.{int(minor) + 1}"
    assert "ipython" in deps            # flashlab.viz displays Markdown and HTML


def test_extras():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"widgets", "torch", "gpu", "book", "student"} <= set(extras)
    assert any(r.startswith("numba-cuda>=") for r in extras["gpu"])
    assert any(r.startswith("torch>=") for r in extras["torch"])
    # a student needs to run and read the chapters, not to build the book or run the tests
    student = " ".join(extras["student"]).lower()
    assert "ipywidgets" in student and "jupyterlab-myst" in student
    assert not any(w in student for w in ("jupyter-book", "pytest", "nbval", "sphinx"))


# -- package data -------------------------------------------------------------------------------

def test_book_data_ships_in_the_package():
    assert not list(ROOT.glob("book/data/*.json"))      # one copy: the package's
    assert flashlab.data.names() == sorted(p.name for p in (ROOT / "flashlab" / "data").glob("*.json"))
    assert PYPROJECT["tool"]["setuptools"]["package-data"]["flashlab.data"] == ["*.json"]
    run = flashlab.data.load_json("bench.json")
    assert run["machine"] and run["config"]


def test_data_accessor_names_the_shipped_files_on_a_bad_name():
    with pytest.raises(ValueError, match="bench.json"):
        flashlab.data.path("nope.json")
    with pytest.raises(ValueError, match="name="):
        flashlab.data.path("../vendor.py")
    with pytest.raises(TypeError, match="name"):
        flashlab.data.path(3)


def test_no_notebook_reads_data_by_a_relative_path():
    """From an empty folder (Colab, a handout, a wheel install) 'data/x.json' does not exist."""
    import json
    for nb in sorted((ROOT / "book").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        assert not re.search(r"""["'](\.\./)*(book/)?data/""", code), nb.name


# -- environments ---------------------------------------------------------------------------------

def test_binder_python_is_the_tested_one():
    assert (ROOT / "runtime.txt").read_text().strip() == "python-3.11"
    assert "3.11" in (ROOT / ".ci" / "run").read_text() or "python3.11" in (ROOT / "Makefile").read_text()


def test_student_requirements_are_pinned_and_small():
    lines = [ln.strip() for ln in (ROOT / "requirements-student.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    pins = dict(_pin(ln) for ln in lines if "==" in ln)
    full = dict(_pin(ln) for ln in (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in ln and not ln.startswith("#"))
    # every pin shared with the full environment is the same version
    assert {k: v for k, v in pins.items() if k in full} == {k: full[k] for k in pins if k in full}
    assert {"numba", "numpy", "ipywidgets", "jupyterlab-myst"} <= set(pins)
    assert "jupyterlab-myst" in full          # make lab and Binder render MyST too
    assert not {"jupyter-book", "pytest", "nbval", "sphinx", "hypothesis"} & set(pins)
    assert len(pins) < 0.8 * len(full)
