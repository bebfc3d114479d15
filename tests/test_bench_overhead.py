"""flashlab.bench.overhead produces its rows (the numbers themselves are the benchmark's, never
asserted here: speed is judged in benchmarks, not unit tests)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the overhead rows time the torch door against SDPA")

from flashlab.bench import overhead  # noqa: E402


def test_rows_have_both_timings_and_the_ratio():
    rows = overhead.overhead_rows(repeats=1, blocks=2)
    assert [tuple(r["shape"]) for r in rows] == list(overhead.SHAPES)
    for r in rows:
        assert r["flashlab_ms"] > 0 and r["sdpa_ms"] > 0
        assert r["ratio"] == pytest.approx(r["flashlab_ms"] / r["sdpa_ms"])
        # each implementation's lowest median of the blocks
        assert len(r["blocks"]) == 2
        assert r["flashlab_ms"] == min(b[0] for b in r["blocks"])
        assert r["sdpa_ms"] == min(b[1] for b in r["blocks"])


def test_lines_give_each_row_its_target_and_the_machine():
    run = {"rows": [{"shape": [1, 16, 1, 8], "flashlab_ms": 2.0, "sdpa_ms": 0.5, "ratio": 4.0},
                    {"shape": [8, 128, 4, 32], "flashlab_ms": 9.0, "sdpa_ms": 6.0, "ratio": 1.5}],
           "first_call": {"flashlab_ms": 900.0, "sdpa_ms": 30.0, "flashlab_import_ms": 1500.0,
                          "numba_setup_ms": 110.0},
           "info": {"machine": "x86_64", "blas": ["openblas SkylakeX"], "load_average": [1, 2, 3]}}
    text = "\n".join(overhead.overhead_lines(run))
    assert "| (1, 16, 1, 8) | 2.000 | 0.500 | 4.00 | <= 0.25 ms |" in text
    assert "| (8, 128, 4, 32) | 9.000 | 6.000 | 1.50 | <= 1.2x SDPA |" in text
    assert "| 900 | 30 | 30.0 | <= 150 ms |" in text
    assert "| 2400 | | | |" in text                  # import + first call
    assert "Numba's one-time setup alone" in text and "| 110 |" in text
    assert "openblas SkylakeX" in text and "load_average" in text


def test_bench_cli_writes_the_overhead_rows(tmp_path):
    """python -m flashlab.bench --overhead-only (the same section the full and quick runs
    append to their report) writes overhead.json with the rows, first calls and machine."""
    import json

    from flashlab.bench.cli import main
    assert main(["--overhead-only", "--repeats", "1", "--out", str(tmp_path)]) == 0
    run = json.loads((tmp_path / "overhead.json").read_text())
    assert [tuple(r["shape"]) for r in run["rows"]] == list(overhead.SHAPES)
    assert run["first_call"]["flashlab_ms"] > 0 and run["first_call"]["sdpa_ms"] > 0
    assert {"machine", "blas", "load_average"} <= set(run["info"])
