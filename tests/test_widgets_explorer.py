"""The explorers (flashlab.widgets.explorer and its four explorers): the grids the static page
offers, every control moving the picture, states equal to the package's own computations, the
static HTML's size, caption and determinism, and the live view reaching values off the grid."""
from __future__ import annotations

import base64
import gzip
import json

import numpy as np
import pytest

from flashlab import rect
from flashlab.cann import INT32_MAX, sparse_mode_mask
from flashlab.masks import EMPTY, band_from, classify_tiles
from flashlab.pipeline.buffers import STRATEGIES
from flashlab.pipeline.settings import HEAD_DIMS, ROPE_MODES, PipelineSettings, run_settings, summary
from flashlab.widgets import EXPLORERS, PipelineExplorer, RooflineExplorer, SparseModeExplorer, TileExplorer
from flashlab.widgets.explorer import MAX_PAYLOAD_BYTES, STATIC_NOTE, Control, Explorer, launch_links
from flashlab.widgets.roofline import CHIPS, forward_point
from flashlab.widgets.sparse import mode_arguments
from flashlab.widgets.tiles import MASK_KINDS, demo_problem


@pytest.fixture(scope="module")
def built():
    """One of each explorer at its defaults, with its payload and static HTML computed once."""
    out = {}
    for kind, cls in EXPLORERS.items():
        ex = cls()
        out[kind] = (ex, ex.payload(), ex.static_html())
    return out


def grid(ex: Explorer) -> dict:
    return {c.name: c.grid for c in ex.controls}


def test_the_grids_are_the_issues():
    t = grid(TileExplorer())
    assert t["block_q"] == t["block_k"] == (4, 8, 16)
    assert t["sq"] == t["sk"] == (16, 36, 64)
    assert t["mask_kind"] == MASK_KINDS and t["window"] == (4, 8, 16)
    p = grid(PipelineExplorer())
    assert p["strategy"] == STRATEGIES and len(p["n_buffers"]) == 2
    assert p["block_q"] == p["block_k"] == (64, 128, 256)
    assert p["head_dims"] == tuple(HEAD_DIMS) and p["rope"] == ROPE_MODES
    assert len(p["hbm_tb_s"]) == 3
    s = grid(SparseModeExplorer())
    assert s["sparse_mode"] == tuple(range(9)) and set(s["sq"]) == set(s["sk"])
    r = grid(RooflineExplorer())
    assert r["kv_hit"][0] == 0.0 and r["kv_hit"][-1] == 1.0 and r["chip"] == tuple(CHIPS)


def test_every_control_moves_the_picture(built):
    for kind, (ex, payload, _) in built.items():
        assert ex.inert_controls() == [], kind
        # the lookup covers every grid combination
        n = 1
        for c in ex.controls:
            n *= len(c.grid)
        assert len(payload["lookup"]) == n and max(payload["lookup"]) == len(payload["states"]) - 1


def test_a_control_that_does_nothing_is_found():
    class Dead(Explorer):
        controls = (Control("a", "a", (1, 2, 3)), Control("b", "b", (0, 1)))

        def state(self, values):
            return {"text": [f"a = {values['a']}"]}

    assert Dead().inert_controls() == ["b"]


def test_static_html_is_small_deterministic_and_captioned(built):
    for kind, (ex, payload, html) in built.items():
        assert len(html.encode()) <= MAX_PAYLOAD_BYTES, kind
        assert STATIC_NOTE in html
        for url in launch_links(ex.notebook).values():
            assert url in html.replace("&amp;", "&")
        # the embedded data is the payload, and a second build gives the same bytes
        data = html.split('class="fx-data">')[1].split("</script>")[0]
        assert json.loads(gzip.decompress(base64.b64decode(data))) == json.loads(json.dumps(payload))
        assert type(ex)().static_html() == html


def test_tile_states_are_the_walks(built):
    ex, payload, _ = built["tiles"]
    for values in ({"block_q": 4, "block_k": 16, "sq": 36, "sk": 64, "mask_kind": "causal"},
                   {"block_q": 16, "block_k": 8, "sq": 64, "sk": 16, "mask_kind": "sliding window",
                    "window": 4},
                   {"block_q": 8, "block_k": 4, "sq": 16, "sk": 36, "mask_kind": "random dense mask"}):
        v = {**ex.values, **values}
        st = ex.state(v)
        walk = ex.walk(v)
        inputs, options = demo_problem(v["sq"], v["sk"], mask_kind=v["mask_kind"], window=v["window"])
        left, right = band_from(options.get("causal", False), options.get("window"))
        cls = classify_tiles(v["sq"], v["sk"], v["block_q"], v["block_k"], left, right, options.get("mask"))
        # one frame per tile of the grid, skipped tiles class 0, as classify_tiles says
        assert len(st["frames"]) == len(st["tiles"]) == cls.size
        assert [t[4] for t in st["tiles"]] == [int(c) for c in cls.ravel()]
        assert f"{len(walk.computed)} computed" in st["text"][0]
        assert int((cls == EMPTY).sum()) == sum(t[4] == 0 for t in st["tiles"])
        # the q-block's rows are final exactly at its last computed tile
        last = {s.qb: k for k, s in enumerate(walk.steps) if not s.skipped}
        for k, frame in enumerate(st["frames"]):
            qb = walk.steps[k].qb
            if qb in last:
                assert frame["text"][2].endswith("its rows are final") == (k >= last[qb])


def test_pipeline_states_are_the_simulation():
    ex = PipelineExplorer()
    for values in ({"strategy": "iterate_all"}, {"strategy": "n_buffers", "n_buffers": 4, "block_k": 64},
                   {"head_dims": "128/128", "rope": "split", "hbm_tb_s": 3.2}):
        v = {**ex.values, **values}
        st = ex.state(v)
        result, baseline, speedup = run_settings(PipelineSettings(**v))
        assert st["text"][1] == summary(result, baseline, speedup)
        assert st["T"] == round(result.makespan / 1e-11)
        assert len([b for b in st["bars"] if b[0] < st["engines"]]) == len(result.graph.tasks)
    # tiles that do not fit: the simulator's message, no bars
    st = ex.state({**ex.values, "block_q": 256, "block_k": 256})
    assert st["error"] and "do not fit in L1" in st["text"][-1] and "bars" not in st


def test_sparse_states_are_the_planners():
    ex = SparseModeExplorer()
    for mode in range(9):
        v = {**ex.values, "sparse_mode": mode, "pre_tokens": INT32_MAX, "next_tokens": 0, "prefix": 10}
        st = ex.state(v)
        if "error" in st:
            continue
        ok = sparse_mode_mask(v["sq"], v["sk"], mode,
                              **mode_arguments(mode, v["sq"], v["sk"], INT32_MAX, 0, v["prefix"]))
        rows = ex.pool[st["mask"]]
        assert np.array_equal(np.array([[c == "1" for c in r] for r in rows]), ok), mode
    # a band whose sides do not overlap: the device's own message
    st = ex.state({**ex.values, "sparse_mode": 4, "pre_tokens": -2, "next_tokens": 0})
    assert st["error"] and "pre_tokens + next_tokens >= 0" in st["text"][-1]
    # modes that ignore pre/next disable them
    assert set(ex.state({**ex.values, "sparse_mode": 2})["off"]) == {"pre_tokens", "next_tokens", "prefix"}


def test_roofline_adapter_is_the_rect_roofline():
    pt = forward_point("910B2", 0.3, "128+64 / 128 (DeepSeek-V3)", 4096)
    (ref,) = rect.kernel_roofline_by_hit(CHIPS["910B2"], rect.MLAProblem(), (0.3,))
    assert pt["flops"] == ref.flops and pt["bytes"] == ref.bytes_moved and pt["bound"] == ref.bound
    h = pt["break_even"]
    assert forward_point("910B2", min(1.0, h + 0.05), "128+64 / 128 (DeepSeek-V3)", 4096)["bound"] == "compute"
    assert forward_point("910B2", max(0.0, h - 0.05), "128+64 / 128 (DeepSeek-V3)", 4096)["bound"] == "memory"
    with pytest.raises(ValueError, match="chip must be one of"):
        forward_point("TPU", 0.5, "64+64 / 64", 1024)


def test_numbers_are_the_states_text(built):
    ex, payload, _ = built["tiles"]
    st = ex.state(ex.values)
    assert ex.numbers(frame=3) == st["text"] + st["frames"][3]["text"]


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="block_q"):
        TileExplorer(block_q=0)
    with pytest.raises(ValueError, match="mask_kind"):
        TileExplorer(mask_kind="diagonal")
    with pytest.raises(TypeError, match="unknown control"):
        RooflineExplorer.__base__.__init__(RooflineExplorer.__new__(RooflineExplorer), speed=3)


def test_the_live_view_reaches_values_off_the_grid():
    pytest.importorskip("ipywidgets")
    ex = TileExplorer()
    widget = ex.live_widget()
    assert ex.live_widget() is widget
    ex.widgets["block_q"].value = 5           # not in the grid (4, 8, 16)
    ex.widgets["sq"].value = 20
    (shown,) = ex.out.outputs
    html = shown["data"]["text/html"]
    data = html.split('class="fx-data">')[1].split("</script>")[0]
    payload = json.loads(gzip.decompress(base64.b64decode(data)))
    assert payload["states"][0]["text"] == ex.state(ex.values)["text"]
    assert "20 x" not in payload["states"][0]["text"][0] and "Sq = 20" in payload["states"][0]["text"][0]
    assert "5 x 8 tiles" in payload["states"][0]["text"][0]
    assert STATIC_NOTE not in html
    # a value the model refuses shows its message and keeps the last state
    pex = PipelineExplorer()
    pex.live_widget()
    pex.widgets["hbm_tb_s"].value = 2.5       # off the grid (0.8, 1.6, 3.2)
    assert pex.values["hbm_tb_s"] == 2.5
    shown = pex.out.outputs[0]["data"]["text/html"].split('class="fx-data">')[1].split("</script>")[0]
    assert "2.5 TB/s" in json.loads(gzip.decompress(base64.b64decode(shown)))["states"][0]["text"][0]
    pex.widgets["block_q"].value = 256        # with block_k 256 below: does not fit L1
    pex.widgets["block_k"].value = 256
    assert "do not fit in L1" in json.dumps(pex.state(pex.values))
    bundle = ex._repr_mimebundle_()
    assert {"text/html", "application/vnd.jupyter.widget-view+json"} <= set(bundle)


# ----------------------------------------------------------------------- in a real browser
def test_explorer_problems_flags_a_dead_control_a_slow_one_and_a_wrong_number():
    from tools.check_site import explorer_problems

    good = {"kind": "tiles", "id": "fx-1", "ready": True, "bytes": 1000, "interactive_ms": 10.0,
            "controls": [{"name": "Br", "values": 3, "changed": True, "ms": [1.0, 2.0]}],
            "samples": [{"values": {}, "frame": 0, "page": ["a"], "python": ["a"]}]}
    assert explorer_problems(good) == []
    dead = {**good, "controls": [{"name": "Br", "values": 3, "changed": False, "ms": [1.0]}]}
    assert "does nothing" in explorer_problems(dead)[0]
    slow = {**good, "controls": [{"name": "Br", "values": 3, "changed": True, "ms": [80.0]}],
            "interactive_ms": 1500.0}
    assert len(explorer_problems(slow)) == 2
    wrong = {**good, "samples": [{"values": {}, "frame": 0, "page": ["a"], "python": ["b"]}]}
    assert "Python computes" in explorer_problems(wrong)[0]


def test_every_explorer_responds_in_headless_chromium(tmp_path):
    """The four static explorers on one page, opened offline in Chromium: every control moves the
    picture within 50 ms, three sampled states show Python's numbers (tools/check_site.py)."""
    import shutil
    from pathlib import Path

    from tools.check_site import check_explorer_file, explorer_line

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("chromium not installed")
    problems, reports = [], []
    for kind, cls in EXPLORERS.items():          # one explorer per page, as in the book
        page = tmp_path / f"{kind}.html"
        page.write_text("<!doctype html><html><head><meta charset='utf-8'></head><body>"
                        + cls().static_html() + "</body></html>")
        found, measured = check_explorer_file(page, chromium, tmp_path / "shots")
        problems += found
        reports += measured
    for r in reports:
        print(explorer_line(r))
    assert problems == []
    assert sorted(r["kind"] for r in reports) == sorted(EXPLORERS)
    assert all(len(r["samples"]) == 3 for r in reports)
    assert len(list(Path(tmp_path / "shots").glob("*-explorer1-*.png"))) == 3 * len(EXPLORERS)


def test_the_static_page_does_not_depend_on_what_was_asked_before():
    ex = TileExplorer()
    html = ex.static_html()
    ex.numbers({"sq": 20, "block_q": 5})       # a state off the grid, with a pool entry of its own
    assert ex.static_html() == html
    fresh = TileExplorer()
    fresh.numbers({"sk": 7})
    assert fresh.static_html() == html
