"""The MLA chapter's core path reads its measured ratios from the committed run
(flashlab/data/bench_mla.json, through flashlab.data) and times nothing live; the measurement
details and caveats are the appendix page book/mla_details, listed right after it."""
from __future__ import annotations

import json
from pathlib import Path

import flashlab.data
from flashlab import bench
from flashlab.rope import DEEPSEEK_V3_NOPE_DIM as DN
from flashlab.rope import DEEPSEEK_V3_V_DIM as DV
from tools.check_site import toc_pages

ROOT = Path(__file__).resolve().parent.parent
FLOWS = ("baseline", "native_v", "rect")


def cells(page: str) -> list[dict]:
    return json.loads((ROOT / "book" / f"{page}.ipynb").read_text())["cells"]


def run() -> dict:
    return bench.load_results(flashlab.data.path("bench_mla.json"))


def case(r: dict, flow: str, direction: str, s: int) -> dict:
    return bench.find_case(r, f"mla:{flow}", direction, s, DN, DV, section="mla")


def test_the_committed_run_holds_every_case_the_core_reads():
    r = run()
    sizes = bench.BenchConfig.from_dict(r["config"]).mla_sizes
    assert len(sizes) >= 2
    for s in sizes:
        for direction in ("forward", "backward"):
            for flow in FLOWS:
                c = case(r, flow, direction, s)
                assert c is not None, (flow, direction, s)
                assert c["seconds"] > 0 and c["peak_extra_bytes"] > 0


def test_the_core_times_nothing_live_and_its_stored_ratios_are_the_committed_runs():
    core = cells("mla")
    code = "\n".join("".join(c["source"]) for c in core if c["cell_type"] == "code")
    for clock in ("process_time", "perf_counter", "time.time(", "traced_peak("):
        assert clock not in code, f"mla.ipynb measures live ({clock}); that belongs on mla_details"
    assert not any("nbval-ignore-output" in c["metadata"].get("tags", []) for c in core)
    assert 'flashlab.data.path("bench_mla.json")' in code
    # the stored sentences are the committed run's ratios (re-execute mla.ipynb after a new run)
    lines = next(c for c in core if c.get("id") == "mla-ratio-lines")
    text = "".join(o["data"]["text/markdown"] if isinstance(o["data"]["text/markdown"], str)
                   else "".join(o["data"]["text/markdown"]) for o in lines["outputs"] if "data" in o)
    r = run()
    big = max(bench.BenchConfig.from_dict(r["config"]).mla_sizes)
    for direction in ("forward", "backward"):
        # the median paired ratio the run stores, with its interval
        pr = bench.PairedRatio.from_dict(case(r, "native_v", direction, big)["paired_vs"]["mla:baseline"])
        assert f"{pr.median:.2f}× ({pr.low:.2f}–{pr.high:.2f}) at $S$ = {big}" in text, direction
    peak = case(r, "rect", "forward", big)["peak_extra_bytes"] / case(r, "baseline", "forward", big)["peak_extra_bytes"]
    assert f"{peak:.0%}" in text


def test_the_details_are_an_appendix_right_after_the_chapter():
    pages = toc_pages(ROOT / "_toc.yml")
    assert pages[pages.index("book/mla") + 1] == "book/mla_details"
    details = "\n".join("".join(c["source"]) for c in cells("mla_details") if c["cell_type"] == "markdown")
    assert "{doc}`mla`" in details[:600]
    core = "\n".join("".join(c["source"]) for c in cells("mla") if c["cell_type"] == "markdown")
    assert "{doc}`mla_details`" in core
