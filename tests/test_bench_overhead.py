"""flashlab.bench.overhead produces its rows (the numbers themselves are the benchmark's, never
asserted here: speed is judged in benchmarks, not unit tests)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the overhead rows time the torch door against SDPA")

from flashlab.bench import overhead  # noqa: E402


def test_rows_have_both_timings_and_the_ratio():
    rows = overhead.overhead_rows(repeats=1)
    assert [tuple(r["shape"]) for r in rows] == list(overhead.SHAPES)
    for r in rows:
        assert r["flashlab_ms"] > 0 and r["sdpa_ms"] > 0
        assert r["ratio"] == pytest.approx(r["flashlab_ms"] / r["sdpa_ms"])
