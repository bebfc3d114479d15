"""The book's launch buttons open what a student should see (issue 34 point 4).

sphinx-book-theme builds the Colab and Binder links of a page as
``<repository>/blob/<branch>/<path_to_book>/<page>.ipynb``; with ``path_to_book: handout`` that is
the committed handout of the chapter (tools/handout.py ``--launch``), with its solutions removed
and its MyST in plain Markdown. Binder builds the light student environment of ``binder/``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tools import handout
from tools.colab_cell import MARKER, chapter_notebooks

ROOT = Path(__file__).resolve().parent.parent
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


def launch_path(page: Path) -> Path:
    """The file a page's launch button opens, as sphinx-book-theme joins it (launch.py:
    ``f"{path_to_docs}/{pagename}{extension}"``)."""
    return ROOT / CONFIG["repository"]["path_to_book"].strip("/") / page.relative_to(ROOT)


def test_launch_buttons_open_the_committed_handouts():
    assert CONFIG["repository"]["path_to_book"] == "handout"
    assert {"colab_url", "binderhub_url"} <= set(CONFIG["launch_buttons"])
    wanted = handout.launch_handouts()
    for page in chapter_notebooks():
        path = launch_path(page)
        assert path.exists(), f"{page.name}: its launch button opens {path}, missing (python tools/handout.py --launch)"
        assert path.read_text() == wanted[str(page.relative_to(ROOT))], \
            f"{path.relative_to(ROOT)} is stale: run python tools/handout.py --launch"
    # nothing left over from a chapter that is gone
    assert sorted(str(p.relative_to(handout.LAUNCH)) for p in handout.LAUNCH.rglob("*.ipynb")) == sorted(wanted)


def test_a_launched_chapter_shows_no_solution_and_no_myst_and_installs_flashlab_in_colab():
    for path in sorted(handout.LAUNCH.rglob("*.ipynb")):
        nb = json.loads(path.read_text())
        text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
        assert not re.search(r":::|\{[a-z]+\}`|\(click to expand\)", text), path.name
        assert not any("hide-cell" in c["metadata"].get("tags", []) for c in nb["cells"]), path.name
        assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code"), path.name
        code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
        assert code and code[0].startswith(MARKER), f"{path.name}: Colab's install cell comes first"


def test_launch_check_sees_a_stale_handout(tmp_path, monkeypatch):
    page = chapter_notebooks()[0]
    monkeypatch.setattr(handout, "LAUNCH", tmp_path)
    handout.write_launch(tmp_path)
    target = tmp_path / page.relative_to(ROOT)
    assert target.read_text() == handout.launch_handouts()[str(page.relative_to(ROOT))]
    (tmp_path / "book" / "gone.ipynb").write_text("{}")
    target.write_text("{}")
    handout.write_launch(tmp_path)                     # rewrites the stale one, removes the extra
    assert not (tmp_path / "book" / "gone.ipynb").exists()
    assert target.read_text() != "{}"


def test_binder_builds_the_student_environment():
    """repo2docker reads binder/ before the repository root: the student's pinned set and
    flashlab, not the developer set (requirements.txt: the book build, the tests, torch...)."""
    lines = [ln.strip() for ln in (ROOT / "binder" / "requirements.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines == ["-r ../requirements-student.txt", "."]
    assert (ROOT / "binder" / "runtime.txt").read_text() == (ROOT / "runtime.txt").read_text()


def test_readme_teaching_section_follows_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    sections = re.findall(r"^## (.+)$", readme, flags=re.M)
    assert sections[:2] == ["Two commands", "Teaching with flashlab"], sections[:3]


def test_the_explorers_launch_links_are_the_books():
    """A static explorer's caption links the chapter on Binder and Colab as the page's launch
    buttons do (flashlab.widgets.explorer's constants agree with _config.yml)."""
    from flashlab.widgets import EXPLORERS
    from flashlab.widgets.explorer import launch_links

    repo = CONFIG["repository"]
    slug = repo["url"].removeprefix("https://github.com/")
    buttons = CONFIG["launch_buttons"]
    assert buttons["notebook_interface"] == "jupyterlab"
    for cls in EXPLORERS.values():
        page = ROOT / "book" / f"{cls.notebook}.ipynb"
        assert page.exists(), cls.notebook
        path = f"{repo['path_to_book']}/{page.relative_to(ROOT)}"
        assert launch_path(page).exists()
        assert launch_links(cls.notebook) == {
            "Binder": f"{buttons['binderhub_url']}/v2/gh/{slug}/{repo['branch']}?urlpath=lab/tree/{path}",
            "Colab": f"{buttons['colab_url']}/github/{slug}/blob/{repo['branch']}/{path}"}
