"""Time flashlab's backward kernel against its forward, for several head dims; write the run.

The backward chapter (``book/backward.ipynb``) compares the measured ratio *backward time /
forward time* with the FLOP ratio 5/2 of the matrix products. Timing takes tens of seconds and
its result depends on the machine and on what else runs on it, so the chapter reads a committed
run, ``flashlab/data/backward_ratio.json``, which this script writes:

    python tools/backward_ratio.py            # from the repository root, on a quiet machine

The measurement: N = 1024, 4 heads, float32, no mask, ``d_qk = d_v = d`` for each head dim,
on **one** Numba thread (a second thread on a shared machine measures the neighbours); forward
and backward alternate 7 times after a warm-up call, and the best time of each is kept. The file
records the date, the machine (``flashlab.bench.machine_info``: CPU, versions, BLAS kernels) and
one row per head dim: ``{"d", "forward_seconds", "backward_seconds", "ratio"}``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numba
import numpy as np

import flashlab
from flashlab.bench import machine_info

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "flashlab" / "data" / "backward_ratio.json"
#: the measured problem: sequence length, heads, head dims, alternating repeats
N, HEADS, DIMS, REPEATS = 1024, 4, (32, 64, 128, 256), 7


def _seconds(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def measure(n: int = N, heads: int = HEADS, dims=DIMS, repeats: int = REPEATS, seed: int = 0) -> list[dict]:
    """One row per head dim d: best-of-``repeats`` forward and backward seconds and their ratio,
    on one Numba thread (the thread count is restored afterwards)."""
    rng = np.random.default_rng(seed)
    rows = []
    saved = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        for d in dims:
            q, k, v, do = (rng.standard_normal((1, heads, n, d)).astype(np.float32) for _ in range(4))
            o, lse = flashlab.flash_attention(q, k, v)
            flashlab.flash_attention_backward(do, q, k, v, o, lse)              # warm-up
            # alternate forward and backward, so a busy moment of the machine hits both alike
            runs = [(_seconds(flashlab.flash_attention, q, k, v),
                     _seconds(flashlab.flash_attention_backward, do, q, k, v, o, lse))
                    for _ in range(repeats)]
            t_fwd, t_bwd = (min(t) for t in zip(*runs))
            rows.append({"d": d, "forward_seconds": t_fwd, "backward_seconds": t_bwd,
                         "ratio": t_bwd / t_fwd})
    finally:
        numba.set_num_threads(saved)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    rows = measure()
    run = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": machine_info(),
           "config": {"n": N, "heads": HEADS, "dtype": "float32", "numba_threads": 1,
                      "repeats": REPEATS, "statistic": "best of the repeats, forward and backward alternating"},
           "rows": rows}
    args.out.write_text(json.dumps(run, indent=1) + "\n")
    for row in rows:
        print(f"d = {row['d']:>3}: backward / forward = {row['ratio']:.2f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
