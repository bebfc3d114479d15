"""The targets: ``TARGETS`` (thresholds), :func:`find_case` (one measured row) and
:func:`evaluate_targets` (each target PASS / MISS / n/a, with its figures).
"""
from __future__ import annotations

from flashlab.bench.config import DIRECTIONS, MB
from flashlab.bench.decode import decode_ratios

__all__ = ["find_case", "TARGETS", "evaluate_targets"]


def find_case(result: dict, impl: str, direction: str, n: int, d_qk: int, d_v: int,
              causal: bool = False, section: str = "attention") -> dict | None:
    """The measured ("ok") row of ``result`` with these fields, or None."""
    for r in result["cases"]:
        if (r["section"], r["impl"], r["direction"], r["n"], r["d_qk"], r["d_v"], r["causal"]) \
                == (section, impl, direction, n, d_qk, d_v, causal) and r["status"] == "ok":
            return r
    return None


def _target(name: str, value: float | None, op: str, threshold: float, detail: str) -> dict:
    """One target line: ``status`` PASS / MISS, or n/a when ``value`` is None."""
    if value is None:
        return {"name": name, "value": None, "op": op, "threshold": threshold,
                "status": "n/a", "detail": detail}
    ok = {">=": value >= threshold, "<=": value <= threshold, "<": value < threshold}[op]
    return {"name": name, "value": value, "op": op, "threshold": threshold,
            "status": "PASS" if ok else "MISS", "detail": detail}


#: the targets' thresholds (see :func:`evaluate_targets`); ``explorer_change_s``: seconds
TARGETS = {"forward_vs_torch": 1.1, "forward_of_peak": 0.85, "mla_forward_vs_torch": 2.0,
           "mla_memory": 1 / 50, "backward_vs_torch": 1.2, "mla_backward_vs_torch": 2.0,
           "causal_over_full": 0.55, "workspace_mb": 100.0, "decode_vs_torch": 1.5,
           "decode_over_read": 1.5, "explorer_change_s": 0.1}


def evaluate_targets(result: dict) -> list[dict]:
    """The targets (``TARGETS``), each a ratio of two figures of the same run (or a
    memory bound): forward D=128 at N 4096 and 8192, causal and not (throughput against torch
    SDPA and against the matmul peak timed with it); forward 192/128 N=8192 (speed and peak
    extra memory against torch); backward D=128 at N 2048 and 4096 and 192/128 at N=4096
    against torch; causal over non-causal time at N=8192; workspace at N=16384; decode at the
    largest Sk of the run (speed against torch, time over the best plain read of K and V on
    every thread, :func:`decode_bench`); the median change of the tile
    explorer and of the pipeline explorer (seconds)."""
    def get(impl, direction, n, d_qk=128, d_v=128, causal=False):
        return find_case(result, impl, direction, n, d_qk, d_v, causal)

    def ratio(a, b, key="seconds"):
        return None if a is None or b is None or key not in a or key not in b else a[key] / b[key]

    T = TARGETS
    missing = "not measured in this run"
    out = []
    for n in (4096, 8192):
        for causal in (False, True):
            what = f"forward D=128 N={n}{' causal' if causal else ' non-causal'}"
            fl, tr = get("flashlab", "forward", n, causal=causal), get("torch_sdpa", "forward", n, causal=causal)
            out.append(_target(f"{what}: throughput / torch SDPA's", ratio(tr, fl), ">=",
                               T["forward_vs_torch"], missing if fl is None or tr is None else
                               f"flashlab {fl['gflops']:.1f}, torch {tr['gflops']:.1f} GFLOP/s"))
            # the matmul timed with the case (a run before interleaving has only the run's peak)
            peak = None if fl is None else fl.get("matmul_gflops", result["matmul"]["peak_gflops"])
            out.append(_target(f"{what}: GFLOP/s / numpy matmul GFLOP/s",
                               None if fl is None else fl["gflops"] / peak, ">=",
                               T["forward_of_peak"], missing if fl is None else
                               f"flashlab {fl['gflops']:.1f}, matmul {peak:.1f} GFLOP/s"))
    fl, tr = get("flashlab", "forward", 8192, 192), get("torch_sdpa", "forward", 8192, 192)
    out.append(_target("forward 192/128 N=8192 non-causal: speed / torch SDPA's",
                       ratio(tr, fl), ">=", T["mla_forward_vs_torch"],
                       missing if fl is None or tr is None else
                       f"flashlab {fl['seconds']:.2f} s, torch {tr['seconds']:.2f} s"))
    mem = ratio(fl, tr, "peak_extra_bytes")
    out.append(_target("forward 192/128 N=8192 non-causal: peak extra memory / torch SDPA's",
                       mem, "<=", T["mla_memory"], missing if mem is None else
                       f"flashlab {fl['peak_extra_bytes'] / MB:.1f} MB, "
                       f"torch {tr['peak_extra_bytes'] / MB:.1f} MB; 1/{1 / max(mem, 1e-12):.0f}"))
    for n, d_qk, key in ((2048, 128, "backward_vs_torch"), (4096, 128, "backward_vs_torch"),
                         (4096, 192, "mla_backward_vs_torch")):
        fl, tr = get("flashlab", "backward", n, d_qk), get("torch_sdpa", "backward", n, d_qk)
        out.append(_target(f"backward {d_qk}/128 N={n} non-causal: speed / torch SDPA's",
                           ratio(tr, fl), ">=", T[key], missing if fl is None or tr is None else
                           f"flashlab {fl['seconds']:.2f} s, torch {tr['seconds']:.2f} s"))
    c, nc = get("flashlab", "forward", 8192, causal=True), get("flashlab", "forward", 8192)
    out.append(_target("forward D=128 N=8192: causal time / non-causal time",
                       ratio(c, nc), "<=", T["causal_over_full"],
                       missing if c is None or nc is None else
                       f"causal {c['seconds']:.2f} s, non-causal {nc['seconds']:.2f} s"))
    for direction in DIRECTIONS:
        r = get("flashlab", direction, 16384)
        has = r is not None and "workspace_bytes" in r
        out.append(_target(f"{direction} D=128 N=16384: flashlab workspace (MB; peak extra "
                           "minus the returned arrays)",
                           r["workspace_bytes"] / MB if has else None, "<", T["workspace_mb"],
                           f"peak extra {r['peak_extra_bytes'] / MB:.1f} MB, of which returned "
                           f"arrays {r['output_bytes'] / MB:.1f} MB" if has else missing))
    rows = result.get("decode") or []
    # the largest decode case, when the run has any
    what, vs_torch, over_read, torch_note, read_note = "decode", None, None, missing, missing
    if rows:
        d = max(rows, key=lambda r: r["sk"])
        r = decode_ratios(d)
        what = f"decode Sq={d['sq']} Sk={d['sk']} H={d['heads']}/Hkv={d['kv_heads']}"
        vs_torch, over_read = r["vs_torch"], r["over_read_2threads"]
        if vs_torch is not None:
            torch_note = (f"flashlab {d['seconds']['flashlab'] * 1e3:.1f} ms, torch "
                          f"{d['seconds']['torch_sdpa'] * 1e3:.1f} ms")
        read_note = (f"flashlab {d['gbps']['flashlab']:.1f} GB/s; read "
                     f"{d['kv_bytes'] / d['best']['read_2threads'] / 1e9:.1f} GB/s on every "
                     f"thread, {d['kv_bytes'] / d['best']['read_numpy'] / 1e9:.1f} GB/s numpy "
                     f"(one thread; flashlab / that: {r['over_read_numpy']:.2f})")
    out.append(_target(f"{what}: speed / torch SDPA's", vs_torch, ">=", T["decode_vs_torch"], torch_note))
    out.append(_target(f"{what}: time / a plain read of K and V (every thread)", over_read, "<=",
                       T["decode_over_read"], read_note))
    for key, label in (("tile_explorer", "tile explorer"),
                       ("pipeline_explorer", "pipeline explorer")):
        t = result.get(key)
        # the tile explorer's record counts "steps", the pipeline explorer's "changes"
        out.append(_target(f"{label}: median seconds per change",
                           None if t is None else t["median_s"], "<", T["explorer_change_s"],
                           missing if t is None else
                           f"slowest {t['max_s']:.3f} s over {t.get('steps', t.get('changes'))} "
                           "changes"))
    return out
