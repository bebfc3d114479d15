"""The committed measurements the chapters read (flashlab/data/, package data) and the scripts that write them."""
from __future__ import annotations

import json
from pathlib import Path

import numba

from tools import backward_ratio

ROOT = Path(__file__).resolve().parent.parent


def test_backward_ratio_measures_one_row_per_head_dim_on_one_thread():
    threads = numba.get_num_threads()
    rows = backward_ratio.measure(n=48, heads=1, dims=(8, 16), repeats=2)
    assert [r["d"] for r in rows] == [8, 16]
    for r in rows:
        assert r["forward_seconds"] > 0 and r["backward_seconds"] > 0
        assert r["ratio"] == r["backward_seconds"] / r["forward_seconds"]
    assert numba.get_num_threads() == threads              # the thread count is restored


def test_committed_backward_ratio_run_has_what_the_chapter_reads():
    run = json.loads((ROOT / "flashlab" / "data" / "backward_ratio.json").read_text())
    assert run["config"]["n"] == backward_ratio.N and run["config"]["repeats"] == backward_ratio.REPEATS
    assert [r["d"] for r in run["rows"]] == list(backward_ratio.DIMS)
    assert run["machine"]["cpu"] and run["date"][:4].isdigit()
    chapter = (ROOT / "book" / "backward.ipynb").read_text()
    assert "data/backward_ratio.json" in chapter and "python tools/backward_ratio.py" in chapter
