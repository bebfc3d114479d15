"""What the backward's LSE check costs: the backward kernel with it against the kernel as it was
before (issue 35), interleaved, on the benchmark's shapes (B = 1, H = 8, D 128/128 and 192/128,
causal and not).

``python tools/bench_lse_check.py [--sizes 1024 2048] [--rounds 7] [--serial] [--base REV]``

The baseline is ``flashlab/kernels/backward.py`` at git revision ``--base`` (default
``dc4b39b``, the parent of the change), loaded as a module of its own and called through the
same front door (:func:`flashlab.flash_attention_backward`) with the new arguments dropped, so
the two differ by the check alone (fused into the recomputation of P, plus the one ``max``
over the per-block flags). Each round times the two back to back, in alternating order; the
cost is the median over rounds of the pair's ratio (a busy machine slows both calls of a
pair alike), shown with the medians and minima of each.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import flashlab
from flashlab import api
from flashlab.bench.config import BenchConfig

ROOT = Path(__file__).resolve().parents[1]


def load_baseline(rev: str):
    """The backward kernel module at git revision ``rev``, imported under another name."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:flashlab/kernels/backward.py"],
                            capture_output=True, text=True, check=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="flashlab-lse-base-"))
    path = folder / "backward_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("backward_base", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["backward_base"] = module
    spec.loader.exec_module(module)
    return module


def baseline_kernels(module, serial: bool) -> api.Kernels:
    """:data:`flashlab.api.PARALLEL` (or SERIAL) with the baseline backward kernel."""
    own = api.SERIAL if serial else api.PARALLEL
    kernel = module.flash_backward_serial if serial else module.flash_backward_kernel

    def backward(*args):
        *head, lse_tol, lse_row, lse_sum, dv_rows = args
        lse_row[:] = -1
        kernel(*head, dv_rows)

    return own._replace(backward=backward)


def main(argv=None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048])
    cli.add_argument("--rounds", type=int, default=7)
    cli.add_argument("--serial", action="store_true", help="the serial builds (one thread)")
    cli.add_argument("--base", default="dc4b39b")
    args = cli.parse_args(argv)
    config = BenchConfig()
    with_check = api.SERIAL if args.serial else api.PARALLEL
    without = baseline_kernels(load_baseline(args.base), args.serial)
    rng = np.random.default_rng(0)
    print(f"{'N':>6} {'Dqk/Dv':>8} {'causal':>6} {'base s':>9} {'check s':>9} {'min base':>9} "
          f"{'min chk':>9} {'cost % (median of pairs)':>25}")
    for n in args.sizes:
        for d_qk, d_v in config.shapes:
            for causal in config.causal:
                q = rng.standard_normal((config.batch, config.heads, n, d_qk), dtype=np.float32)
                k = rng.standard_normal((config.batch, config.heads, n, d_qk), dtype=np.float32)
                v = rng.standard_normal((config.batch, config.heads, n, d_v), dtype=np.float32)
                do = rng.standard_normal(v.shape[:2] + (n, d_v), dtype=np.float32)
                o, lse = flashlab.flash_attention(q, k, v, causal=causal)
                times: dict[str, list[float]] = {"base": [], "check": []}
                for r in range(args.rounds + 1):          # round 0: warm-up (compiles)
                    order = (("base", without), ("check", with_check))
                    for name, kernels in (order if r % 2 else order[::-1]):
                        api.kernels_for = lambda p, kernels=kernels: kernels
                        t0 = time.perf_counter()
                        flashlab.flash_attention_backward(do, q, k, v, o, lse, causal=causal)
                        if r:
                            times[name].append(time.perf_counter() - t0)
                base, check = (statistics.median(times[x]) for x in ("base", "check"))
                # cost = median_r (check_r / base_r) - 1
                cost = statistics.median(c / b for b, c in zip(times["base"], times["check"])) - 1
                print(f"{n:>6} {f'{d_qk}/{d_v}':>8} {causal!s:>6} {base:9.4f} {check:9.4f} "
                      f"{min(times['base']):9.4f} {min(times['check']):9.4f} {100 * cost:25.2f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
