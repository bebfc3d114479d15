"""The Performance chapter's core path reads one committed run (flashlab/data/performance_live.json,
written by ``python -m flashlab.bench._page``): it must hold what the page reads."""
from __future__ import annotations

import json
from pathlib import Path

from flashlab import bench
from flashlab.bench import _page

PAGE_JSON = Path(__file__).resolve().parent.parent / "flashlab" / "data" / "performance_live.json"


def test_the_committed_page_run_holds_what_the_page_reads():
    page = json.loads(PAGE_JSON.read_text())
    for key in ("date", "machine", "bandwidth", "peak", "live", "ceiling"):
        assert key in page, key
    for setting in ("1 thread", "all threads"):
        assert page["bandwidth"][setting] > 0 and page["peak"][setting] > 0
    rows = bench.case_table(page["live"])
    assert {r["n"] for r in rows} == set(_page.PAGE_CONFIG.sizes)
    assert {"flashlab", "products"} <= set(page["ceiling"]["seconds"])


def test_page_config_is_the_small_one_thread_run():
    cfg = _page.PAGE_CONFIG
    assert cfg.heads == 4 and cfg.shapes == ((128, 128),) and max(cfg.sizes) == 2048
