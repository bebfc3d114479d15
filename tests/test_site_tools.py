"""The book's site tooling: link checking, the Colab cell, offline assets, script dedupe, and the
book-wide rules of issue #7 (alt text on every figure, goals/summary/exercises in every chapter)."""
from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from tools import book_ext, colab_cell, web_assets
from tools.check_site import ELEMENTS_JS, check_links, element_clip, element_rect_js, element_shot_path, toc_pages

ROOT = Path(__file__).resolve().parent.parent
#: notebook pages that are reference material or an appendix, not chapters (no goals, summary or
#: exercises)
REFERENCE_PAGES = ("book/api", "book/cheatsheet", "book/performance_details", "book/mla_details",
                   "book/npu_calibration")
CHAPTERS = [p for p in toc_pages(ROOT / "_toc.yml")
            if (ROOT / f"{p}.ipynb").exists() and p not in REFERENCE_PAGES]


def test_toc_pages_lists_every_entry_in_order():
    pages = toc_pages(ROOT / "_toc.yml")
    assert pages[0] == "book/intro"
    assert {"book/tiling_online_softmax", "book/glossary", "book/references", "book/api"} <= set(pages)
    for p in pages:
        assert (ROOT / f"{p}.md").exists() or (ROOT / f"{p}.ipynb").exists(), p


def _site(tmp_path: Path, pages: dict[str, str]) -> Path:
    for name, body in pages.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"<html><body>{body}</body></html>")
    return tmp_path


def test_check_links_accepts_good_links_and_ignores_external(tmp_path):
    site = _site(tmp_path, {"index.html": '<a href="book/a.html#sec">a</a> <a href="https://x.org/y">x</a>',
                            "book/a.html": '<h1 id="sec">A</h1><a href="../index.html">up</a><a href="#sec">self</a>'})
    assert check_links(site) == []


def test_check_links_reports_missing_file_and_missing_anchor(tmp_path):
    site = _site(tmp_path, {"index.html": '<a href="book/nope.html">1</a> <a href="book/a.html#gone">2</a>',
                            "book/a.html": '<h1 id="sec">A</h1>'})
    problems = check_links(site)
    assert len(problems) == 2
    assert any("broken link 'book/nope.html'" in p for p in problems)
    assert any("broken anchor 'book/a.html#gone'" in p for p in problems)


def test_element_screenshots_are_named_after_the_page(tmp_path):
    shot = tmp_path / "tiling_online_softmax.png"
    assert element_shot_path(shot, 1) == tmp_path / "tiling_online_softmax-1.png"
    assert element_shot_path(shot, 12).name == "tiling_online_softmax-12.png"


def test_element_clip_covers_the_element_in_whole_pixels():
    # fractional document coordinates: the clip starts at the floor and ends at the ceiling
    clip = element_clip({"x": 10.4, "y": 5000.6, "width": 600.2, "height": 300.1})
    assert clip == {"x": 10, "y": 5000, "width": 601, "height": 301, "scale": 1}
    # kept inside the page's width, never at a negative offset
    assert element_clip({"x": -3, "y": 0, "width": 2000, "height": 50}, page_width=1280) == \
        {"x": 0, "y": 0, "width": 1280, "height": 50, "scale": 1}
    # a missing or collapsed element gets no screenshot
    assert element_clip(None) is None
    assert element_clip({"x": 0, "y": 0, "width": 500, "height": 0}) is None


def test_element_probe_looks_for_animations_and_widget_views():
    # the animations (captioned figure or bare to_jshtml player) and the saved widget views
    for selector in (".flashlab-animation", "div.animation", "application/vnd.jupyter.widget-view+json"):
        assert selector in ELEMENTS_JS
    js = element_rect_js(3)
    assert "[3]" in js and "scrollIntoView" in js and "window.scrollY" in js


def test_every_notebook_has_the_current_colab_cell():
    assert colab_cell.main(["--check"]) == 0
    src = colab_cell.cell_source()
    url, _ = colab_cell.repository()
    # a release tag matching the package's one version, never a moving branch such as @main
    import flashlab
    assert colab_cell.release_tag() == f"v{flashlab.__version__}"
    assert f"git+{url}@v{flashlab.__version__}\"" in src and '"google.colab" in sys.modules' in src


def test_colab_cell_check_catches_a_notebook_without_it(tmp_path):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# T"]}], "metadata": {},
          "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "x.ipynb"
    path.write_text(json.dumps(nb))
    assert colab_cell.stale(path)
    assert colab_cell.update(path) and not colab_cell.stale(path)
    cells = json.loads(path.read_text())["cells"]
    assert cells[1]["metadata"]["tags"] == ["remove-cell"]
    assert not colab_cell.update(path)           # idempotent


def test_web_assets_rejects_a_download_with_the_wrong_integrity(monkeypatch, tmp_path):
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:gz") as tar:
        data = b"console.log(1)"
        info = tarfile.TarInfo("package/dist/embed.js")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(web_assets.urllib.request, "urlopen", lambda url, timeout: Response(payload.getvalue()))
    monkeypatch.setattr(web_assets, "VENDOR", tmp_path)
    asset = web_assets.Asset("@scope/pkg", "1.0.0", "sha512-AAAA", ("dist/",), (".map",), "pkg")
    assert asset.url == "https://registry.npmjs.org/@scope/pkg/-/pkg-1.0.0.tgz"
    with pytest.raises(RuntimeError, match="sha512 of the download"):
        web_assets.fetch(asset)
    assert not web_assets.is_current(asset)


def test_book_ext_dedupes_inline_scripts_in_place():
    from sphinx.builders.html._assets import _JavaScript
    scripts = [_JavaScript(None, body="const A = 1"), _JavaScript("x.js"), _JavaScript("", body="const A = 1"),
               _JavaScript("x.js", **{"async": "async"})]
    context = {"script_files": scripts}
    book_ext.dedupe_scripts(None, "p", "page.html", context, None)
    assert context["script_files"] is scripts                 # the builder's own list, mutated
    assert [str(s.filename or "") for s in scripts] == ["", "x.js", "x.js"]


def test_animation_html_adds_alt_and_drops_the_cdn_icon_font():
    import matplotlib
    matplotlib.use("Agg")
    from flashlab.viz import animation_html
    from flashlab.widgets import tile_walk_animation
    anim = tile_walk_animation(4, 4, 2, 2, dpi=30)
    html = animation_html(anim, alt="a <walk>", caption="cap").data
    assert 'alt="a &lt;walk&gt;"' in html and "<figcaption>cap</figcaption>" in html
    assert "font-awesome" not in html and 'class="fa' not in html
    with pytest.raises(ValueError, match="alt"):
        animation_html(anim, alt=" ")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


@pytest.mark.parametrize("page", CHAPTERS + list(REFERENCE_PAGES))
def test_every_figure_has_alt_text(page):
    for i, cell in enumerate(_cells(ROOT / f"{page}.ipynb")):
        images = [o for o in cell.get("outputs", []) if "image/png" in o.get("data", {})]
        if images:
            alt = cell["metadata"].get("mystnb", {}).get("image", {}).get("alt", "")
            assert len(alt.strip()) >= 20, f"{page} cell {i}: an image output without alt text (mystnb.image.alt)"


@pytest.mark.parametrize("page", CHAPTERS)
def test_every_chapter_has_goals_summary_and_exercises(page):
    cells = _cells(ROOT / f"{page}.ipynb")
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "Learning goals" in text[:3000], f"{page}: no learning goals at the top"
    assert "## Summary" in text and "## Exercises" in text
    assert text.index("## Summary") < text.index("## Exercises")
    exercises = text[text.index("## Exercises"):]
    # each exercise has its solution collapsed: a dropdown admonition, or a hidden code cell
    solutions = exercises.count(":class: dropdown") + exercises.count("Solution (click to expand)")
    assert 3 <= solutions <= 5, f"{page}: {solutions} exercises with solutions (issue #7: 2-4, plus a coding one)"
    hidden = [c for c in cells if "hide-cell" in c["metadata"].get("tags", [])]
    assert hidden and all(c["metadata"].get("jupyter", {}).get("source_hidden") for c in hidden)
    assert any("check_" in "".join(c["source"]) for c in hidden), f"{page}: no coding exercise with a checker"


def test_exercise_checkers_are_exported():
    import flashlab.exercises as ex
    checkers = [n for n in dir(ex) if n.startswith("check_")]
    assert len(checkers) >= 10
    assert set(checkers) <= set(ex.__all__)
    assert all(callable(getattr(ex, n)) for n in checkers)
    assert np.all([getattr(ex, n).__doc__ for n in checkers])


@pytest.mark.parametrize("page", CHAPTERS)
def test_handout_removes_every_solution_and_output(page):
    from tools.handout import strip_solutions
    nb = json.loads((ROOT / f"{page}.ipynb").read_text())
    handout, removed = strip_solutions(nb)
    assert removed >= 3
    text = "\n".join("".join(c["source"]) for c in handout["cells"])
    assert "admonition} Solution" not in text and "Solution (click to expand)" not in text
    assert not any(c.get("outputs") for c in handout["cells"] if c["cell_type"] == "code")
    assert "## Exercises" in text and "check_" in text           # the tasks and starters stay
    # every code cell but the solutions (and empty ones) stays; tests/test_handout.py checks the rest
    kept = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()
            and "hide-cell" not in c["metadata"].get("tags", [])]
    assert sum(c["cell_type"] == "code" for c in handout["cells"]) == len(kept)


def test_cjk_font_problems():
    from tools.check_site import CJK_FILE, cjk_font_problems
    url = f"http://127.0.0.1/_static/fonts/noto-sans-sc/{CJK_FILE}"
    ok = dict(cjkText=True, cjkFace=["loaded"], cjkRequested=[url])
    assert cjk_font_problems(ok) == []
    # drawn by a system font: the face exists but was never loaded from the site
    assert "was not loaded" in cjk_font_problems(dict(ok, cjkFace=["unloaded"], cjkRequested=[]))[0]
    assert "no @font-face" in cjk_font_problems(dict(ok, cjkFace=[]))[0]
    assert cjk_font_problems(dict(cjkText=False, cjkFace=["unloaded"], cjkRequested=[])) == []
    assert "unicode-range" in cjk_font_problems(dict(cjkText=False, cjkFace=["loaded"], cjkRequested=[url]))[0]


def test_cjk_font_is_pinned_served_and_declared():
    from tools import web_assets
    from tools.check_site import CJK_FAMILY, CJK_FILE
    (font,) = [a for a in web_assets.ASSETS if a.name == "@fontsource/noto-sans-sc"]
    assert font.integrity.startswith("sha512-") and font.keep == (f"files/{CJK_FILE}",)
    css = (ROOT / "book/_static/cjk-font.css").read_text()
    assert f'font-family: "{CJK_FAMILY}"' in css and "unicode-range: U+2E80" in css
    assert f'url("{font.target}/{CJK_FILE}")' in css          # _static/cjk-font.css -> _static/fonts/...
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]["config"]
    assert "cjk-font.css" in config["html_css_files"] and "_vendor" in config["html_static_path"]


def test_exercises_page_names_each_chapters_function_and_checker():
    """book/exercises.md lists, per chapter, the function the chapter's exercise asks for and
    its checker: both must be what the chapter's notebook really defines and calls."""
    import re

    import flashlab.exercises as ex
    page = (ROOT / "book/exercises.md").read_text()
    entries = re.findall(r"\{doc\}`(\w+)`: write `(\w+)\(([^)]*)\)`, check it with `(\w+)`", page)
    assert len(entries) >= 10
    for chapter, fn, args, checker in entries:
        source = "\n".join("".join(c["source"]) for c in _cells(ROOT / f"book/{chapter}.ipynb"))
        assert re.search(rf"def {fn}\({re.escape(args.split(',')[0])}", source), f"{chapter}: no def {fn}({args})"
        assert f"{checker}({fn})" in source, f"{chapter}: does not call {checker}({fn})"
        assert hasattr(ex, checker)


def test_web_assets_offline_prints_one_message_naming_the_missing_assets(monkeypatch, tmp_path, capsys):
    import urllib.error

    def offline(url, timeout):
        raise urllib.error.URLError(OSError(-3, "Temporary failure in name resolution"))

    monkeypatch.setattr(web_assets.urllib.request, "urlopen", offline)
    monkeypatch.setattr(web_assets, "VENDOR", tmp_path)
    assert web_assets.main([]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "Temporary failure in name resolution" in err
    for asset in web_assets.ASSETS:         # every missing asset named, and the fetch command
        assert f"{asset.name}@{asset.version}" in err
    assert "python tools/web_assets.py" in err


OVERFLOW_PAGE = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
<style>body{margin:0} article{width:300px;margin-left:20px} .clip{overflow:hidden}
.scroll{overflow-x:auto} .wide{width:600px;height:10px;background:#888}
.styled::-webkit-scrollbar{height:8px} .styled::-webkit-scrollbar-thumb{background:#999}
.sr-only{position:absolute;width:1px;height:1px;overflow:hidden}</style></head><body>
<article class="bd-article">
<section id="cut"><div class="math clip"><div class="wide">an equation</div></div></section>
<section id="out"><pre>a_very_long_code_line_without_any_space_that_runs_far_to_the_right_of_the_column</pre></section>
<section id="hidden-bar">
<div class="math clip"><div class="scroll"><div class="wide">an equation that scrolls unseen</div></div></div></section>
<section id="fine"><div class="scroll styled"><div class="wide">a table with its scrollbar</div></div>
<span class="math clip">x<span class="sr-only">the formula read aloud, much wider than the formula</span></span>
<span class="sr-only">screen-reader text that is clipped on purpose</span><p>short text</p></section>
</article></body></html>"""


@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium")
def test_overflow_probe_reports_cut_off_hidden_scroll_and_sticking_out_content_only(tmp_path):
    from tools.check_site import CDP, WIDTHS, _launch_chromium, _overflow_problems

    page = tmp_path / "page.html"
    page.write_text(OVERFLOW_PAGE)
    profile = tmp_path / "profile"
    profile.mkdir()
    proc, ws_url = _launch_chromium(shutil.which("chromium"), profile)
    try:
        cdp = CDP(ws_url)
        target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        cdp.send("Page.enable", session=session)
        cdp.send("Page.navigate", {"url": page.as_uri()}, session=session)
        assert cdp.wait_event("Page.loadEventFired", session, 30)
        for width in WIDTHS.values():
            found = _overflow_problems(cdp, session, width)
            assert len(found) == 3, found
            cut, unseen, out = found
            assert cut.startswith(f"at {width} px: cut off: 300 px hidden") and "#cut" in cut
            assert "shows no scrollbar" in unseen and "#hidden-bar" in unseen
            assert "sticks out of the text column" in out and "#out" in out and "a_very_long" in out
            assert not any("#fine" in problem for problem in found)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_phone_screenshot_is_named_after_the_page_and_is_no_element_shot():
    from tools.check_site import phone_shot_path

    shot = phone_shot_path(Path("_build/screenshots/masks.png"))
    assert shot.name == "masks-phone.png"
    assert not shot.stem.removeprefix("masks-").isdigit()       # not taken for <page>-<n>.png
