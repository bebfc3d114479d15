"""Results on disk and on the page: :func:`save_results` / :func:`load_results` (``bench.json``
and ``bench.md``), :func:`merge_results` (runs of one configuration at different sizes), the
row tables (:func:`case_table`, :func:`backward_over_forward`) and the
markdown report (:func:`to_markdown`).
"""
from __future__ import annotations

import json
from pathlib import Path

from flashlab.bench.config import DIRECTIONS, MB, SCHEMA, BenchConfig, Case
from flashlab.bench.decode import decode_ratios
from flashlab.bench.targets import evaluate_targets

__all__ = ["save_results", "load_results", "merge_results", "case_table", "backward_over_forward", "to_markdown"]


def save_results(result: dict, out: Path | str = "bench-results") -> tuple[Path, Path]:
    """Write ``bench.json`` and ``bench.md`` into the folder ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "bench.json", out / "bench.md"
    paths[0].write_text(json.dumps(result, indent=1) + "\n")
    paths[1].write_text(to_markdown(result))
    return paths


def load_results(path: Path | str) -> dict:
    """Read a result written by :func:`save_results` (``bench.json``)."""
    res = json.loads(Path(path).read_text())
    if res.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {res.get('schema')!r}, expected {SCHEMA}")
    return res


def merge_results(parts: list[dict]) -> dict:
    """One result from runs that differ only in their sizes (``sizes``, ``mla_sizes``, e.g. one
    command per size so that each stays short): the cases of all, the MLA rows after the others'
    as :func:`run_suite` orders them, each size's rows from the part that ran it.

    The first part gives the date, machine and notes; the load average at the start is the first
    part's, at the end the last one's, and ``parts`` keeps each part's date, sizes, time budget
    (``max_timed_seconds``, which may differ: the merged configuration has the largest), load
    averages and duration. ``ValueError`` if the parts' configurations differ in more than these,
    or their CPU, or a size is in two parts.
    """
    if not parts:
        raise ValueError("parts must hold at least one result")
    sized = ("sizes", "mla_sizes")
    own = sized + ("max_timed_seconds",)      # what each part may set for itself
    first = parts[0]
    for p in parts[1:]:
        rest = {k: v for k, v in p["config"].items() if k not in own}
        if rest != {k: v for k, v in first["config"].items() if k not in own}:
            raise ValueError(f"parts must share their configuration but for {own}")
        if p["machine"]["cpu"] != first["machine"]["cpu"] or p.get("timing") != first.get("timing"):
            raise ValueError("parts must come from one machine and one timing")
    config = dict(first["config"])
    for key in sized:
        values = [n for p in parts for n in p["config"][key]]
        if len(set(values)) != len(values):
            raise ValueError(f"a size of {key} is in two parts: {values}")
        config[key] = sorted(values)
    config["max_timed_seconds"] = max(p["config"]["max_timed_seconds"] for p in parts)
    cases = [c for p in parts for c in p["cases"]]
    cases = [c for c in cases if c["section"] != "mla"] + [c for c in cases if c["section"] == "mla"]
    matmul = {"start": first["matmul"]["start"], "end": parts[-1]["matmul"]["end"],
              "groups": [g for p in parts for g in p["matmul"]["groups"]]}
    matmul["peak_gflops"] = max(p["matmul"]["peak_gflops"] for p in parts)
    result = {**first, "config": config, "cases": cases, "matmul": matmul,
              "decode": [d for p in parts for d in p["decode"]],
              "load_average_end": parts[-1]["load_average_end"],
              "duration_seconds": sum(p["duration_seconds"] for p in parts),
              "parts": [{k: p[k] for k in ("date", "load_average_start", "load_average_end",
                                           "duration_seconds")}
                        | {k: p["config"][k] for k in own} for p in parts]}
    result["backward_over_forward"] = backward_over_forward(result)
    result["targets"] = evaluate_targets(result)
    return result


def case_table(result: dict, *, section: str = "attention", direction: str | None = None,
               status: str | None = "ok") -> list[dict]:
    """The rows of ``result`` of one section (and direction, status), e.g. to plot."""
    return [r for r in result["cases"] if r["section"] == section
            and (direction is None or r["direction"] == direction)
            and (status is None or r["status"] == status)]


def backward_over_forward(result: dict) -> list[dict]:
    """The backward's time over the forward's, per implementation and attention shape.

    One dict per (N, Dqk, Dv, causal, implementation) measured in both directions:
    ``forward_seconds``, ``backward_seconds``, ``ratio`` (backward / forward) and
    ``flop_ratio``, the matmul FLOPs of the backward over the forward's
    (:func:`flashlab.flops.attention_backward_flops` / :func:`~flashlab.flops.attention_flops`:
    ``(3 Dqk + 2 Dv) / (Dqk + Dv)``, 2.5 at equal dims, 2.6 at 192/128; causal cases of flashlab
    also by the two directions' tile fractions, which differ with their block sizes). The
    backward is timed alone (its forward's outputs ready), so ``ratio`` near ``flop_ratio``
    means both directions run their matmuls equally fast.
    """
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in case_table(result):
        key = (r["n"], r["d_qk"], r["d_v"], r["causal"], r["impl"])
        by_key.setdefault(key, {})[r["direction"]] = r
    out = []
    for (n, d_qk, d_v, causal, impl), rows in by_key.items():
        if set(rows) != set(DIRECTIONS):
            continue
        fwd, bwd = rows["forward"], rows["backward"]
        out.append({"n": n, "d_qk": d_qk, "d_v": d_v, "causal": causal, "impl": impl,
                    "forward_seconds": fwd["seconds"], "backward_seconds": bwd["seconds"],
                    "ratio": bwd["seconds"] / fwd["seconds"],
                    "flop_ratio": bwd["flops"] / fwd["flops"]})
    return out


def _backward_over_forward_table(rows: list[dict]) -> list[str]:
    """Markdown lines of :func:`backward_over_forward`'s ``rows``."""
    lines = ["| N | Dqk/Dv | causal | implementation | forward (ms) | backward (ms) "
             "| backward / forward | matmul FLOPs ratio |", "|---:|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['n']} | {r['d_qk']}/{r['d_v']} | {'yes' if r['causal'] else 'no'} "
                     f"| {r['impl']} | {r['forward_seconds'] * 1e3:.1f} "
                     f"| {r['backward_seconds'] * 1e3:.1f} | {r['ratio']:.2f} "
                     f"| {r['flop_ratio']:.2f} |")
    return lines


def _fmt(x, spec: str, suffix: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{suffix}"


def _mb(r: dict, key: str) -> str:
    """``r[key]`` bytes in MB with one decimal, or a dash if absent."""
    return _fmt(r[key] / MB if key in r else None, ".1f")


def _attention_table(result: dict, direction: str) -> list[str]:
    head = ("| N | Dqk/Dv | causal | implementation | time (ms) | GFLOP/s | % matmul peak "
            "| speed vs numpy naive | speed vs torch | peak extra (MB) | workspace (MB) "
            "| memory vs torch | first call (s) |")
    lines = [head, "|---:|---|---|---|" + "---:|" * 9]
    for r in case_table(result, direction=direction):
        sv, mv = r.get("speed_vs", {}), r.get("memory_vs", {})
        lines.append(
            f"| {r['n']} | {r['d_qk']}/{r['d_v']} | {'yes' if r['causal'] else 'no'} | {r['impl']} "
            f"| {r['seconds'] * 1e3:.1f} | {r['gflops']:.1f} | {r['fraction_of_matmul_peak']:.0%} "
            f"| {_fmt(sv.get('numpy_naive'), '.2f', 'x')} | {_fmt(sv.get('torch_sdpa'), '.2f', 'x')} "
            f"| {_mb(r, 'peak_extra_bytes')} | {_mb(r, 'workspace_bytes')} "
            f"| {_fmt(mv.get('torch_sdpa'), '.3f', 'x')} | {_fmt(r.get('first_call_seconds'), '.2f')} |")
    return lines


def _mla_table(result: dict) -> list[str]:
    head = ("| S | direction | implementation | time (ms) | GFLOP/s (useful) | speed vs baseline "
            "| speed vs torch | peak extra (MB) | modelled peak (MB) | memory vs baseline |")
    lines = [head, "|---:|---|---|" + "---:|" * 7]
    for r in case_table(result, section="mla"):
        sv, mv = r.get("speed_vs", {}), r.get("memory_vs", {})
        name = r["impl"] if r["impl"].startswith("mla:") else f"{r['impl']} (concatenated 192/128)"
        lines.append(
            f"| {r['n']} | {r['direction']} | {name} | {r['seconds'] * 1e3:.1f} | {r['gflops']:.1f} "
            f"| {_fmt(sv.get('mla:baseline'), '.2f', 'x')} | {_fmt(sv.get('torch_sdpa'), '.2f', 'x')} "
            f"| {_mb(r, 'peak_extra_bytes')} | {_mb(r, 'model_peak_bytes')} "
            f"| {_fmt(mv.get('mla:baseline'), '.2f', 'x')} |")
    return lines


def _blas_lines(m: dict) -> list[str]:
    """The BLAS kernels of the run (results before they were recorded have none)."""
    if not m.get("blas"):
        return []
    # MKL (torch's, when it is loaded) reports no architecture
    libs = "; ".join(f"{b['role']}: {b['library']} {b['version']}"
                     + (f", {b['architecture']} kernels" if b.get("architecture") else "")
                     for b in m["blas"])
    pin = m.get("openblas_coretype")
    how = (f"OPENBLAS_CORETYPE={pin} in the environment" if pin
           else "OPENBLAS_CORETYPE unset: OpenBLAS chose by CPU")
    return [f"BLAS: {libs} ({how}).", ""]


def to_markdown(result: dict) -> str:
    """A markdown report of :func:`run_suite`'s result (targets first), section by section."""
    cfg = BenchConfig.from_dict(result["config"])
    lines = _setup_lines(result, cfg) + _peak_lines(result["matmul"])
    lines += _first_call_lines(result["numba_first_call"] or {})
    lines += _tool_lines(result) + _target_lines(result)
    for direction in DIRECTIONS:
        if not case_table(result, direction=direction, status=None):
            continue  # e.g. --mla-only
        lines += _direction_lines(result, direction)
    lines += _decode_lines(result) + _backward_forward_lines(result) + _mla_lines(result, cfg)
    lines += _skipped_lines(result)
    return "\n".join(lines) + "\n"


def _setup_lines(result: dict, cfg: BenchConfig) -> list[str]:
    """Title, machine, BLAS and the cases measured."""
    m = result["machine"]
    return [f"# flashlab benchmark ({result['date']})", "",
            f"Machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_total_bytes'] / 1e9:.0f} GB; "
            f"Python {m['python']}, numpy {m['numpy']}, numba {m['numba']} "
            f"({m['numba_threads']} threads), torch {m['torch'] or 'not installed'}"
            + (f" ({m['torch_threads']} threads)" if m["torch"] else "") + ". "
            f"Load average {result['load_average_start'][0]:.2f} at the start, "
            f"{result['load_average_end'][0]:.2f} at the end; the run took "
            f"{result['duration_seconds']:.0f} s. Shared machine: compare ratios, not absolute "
            f"figures.", ""] + _blas_lines(m) + [
            f"Cases: B={cfg.batch}, H={cfg.heads}, float32, N in {list(cfg.sizes)}, Dqk/Dv in "
            f"{[f'{a}/{b}' for a, b in cfg.shapes]}, causal in {list(cfg.causal)}; flashlab "
            f"blocks {cfg.block[0]}x{cfg.block[1]} forward, "
            f"{cfg.backward_block[0]}x{cfg.backward_block[1]} backward; "
            + (f"time: one thread's {'user-mode ' if cfg.clock == 'user' else ''}CPU time, the median"
               f" of {cfg.min_rounds} to {cfg.max_rounds} "
               "rounds after a warm-up call, until every paired ratio resolves ±5 %"
               if cfg.paired else
               f"time: the median of up to {cfg.repeats} timed call(s) after a warm-up call")
            + ("; the implementations of a shape timed in turn, round by round"
               if result.get("timing") in ("interleaved", "paired") else
               "; each case timed on its own (a run before interleaved timing)")
            + f"; peak memory (a fresh process per case) at N in "
            f"{'all' if cfg.memory_sizes is None else list(cfg.memory_sizes)}, causal in "
            f"{list(cfg.memory_causal)}.", ""]


def _peak_lines(mm: dict) -> list[str]:
    """The numpy matmul peak the cases are compared with."""
    lines = ["## Machine peak", "",
             f"numpy float32 ({mm['start']['n']}x{mm['start']['n']}) @ ({mm['start']['n']}x"
             f"{mm['start']['n']}): {mm['start']['gflops']:.1f} GFLOP/s at the start, "
             f"{mm['end']['gflops']:.1f} at the end"]
    if mm.get("groups"):
        g = [x["gflops"] for x in mm["groups"]]
        lines[-1] += (f", {min(g):.1f} to {max(g):.1f} when timed with the cases (each case's "
                      f"% matmul peak is against the matmul timed with it)")
    else:
        lines[-1] += "; % matmul peak below is against the best of the two"
    lines[-1] += f". Peak: **{mm['peak_gflops']:.1f} GFLOP/s**."
    lines.append("")
    return lines


def _first_call_lines(nb: dict) -> list[str]:
    """Import and first-call times of a fresh process (compile, then cache load)."""
    lines: list[str] = []
    if nb:
        lines += ["## Numba first call", "", "A fresh process: import flashlab, then the first "
                  "tiny forward and backward calls.", "",
                  "| process | import (s) | first forward (s) | first backward (s) | "
                  "first decode (s) |",
                  "|---|---:|---:|---:|---:|"]
    for what, label in (("compile", "empty cache (compile)"), ("cache_load", "cache load")):
        if nb.get(what):
            t = nb[what]
            lines.append(f"| {label} | {t['import_seconds']:.2f} | {t['forward_seconds']:.2f} "
                         f"| {t['backward_seconds']:.2f} | {_fmt(t.get('decode_seconds'), '.2f')} |")
    return lines


def _tool_lines(result: dict) -> list[str]:
    """The pipeline simulator's speed and one step of each explorer."""
    lines: list[str] = []
    if result.get("simulator"):
        lines += ["", "## Pipeline simulator", "",
                  "flashlab.pipeline: building a task graph and simulating it (best of 3). The "
                  "target is the simulation: 10^5 tasks in under a second.", "",
                  "| graph | tasks | build (s) | simulate (s) | tasks/s simulated |",
                  "|---|---:|---:|---:|---:|"]
        for name, t in result["simulator"].items():
            lines.append(f"| {name} | {t['tasks']} | {t['build_s']:.2f} | {t['simulate_s']:.2f} "
                         f"| {t['tasks_per_s']:,.0f} |")
    if result.get("tile_explorer"):
        t = result["tile_explorer"]
        lines += ["", "## Tile explorer", "",
                  f"One step of the tile explorer (flashlab.viz.tiles.WalkView: move the artists, "
                  f"draw and encode the PNG) for {t['problem']}: median {t['median_s'] * 1e3:.0f} ms, "
                  f"slowest {t['max_s'] * 1e3:.0f} ms over {t['steps']} steps (the explorer plays "
                  f"a step every {t['play_interval_s'] * 1e3:.0f} ms; target: median under "
                  f"{t['target_s'] * 1e3:.0f} ms)."]
    if result.get("pipeline_explorer"):
        t = result["pipeline_explorer"]
        lines += ["", "## Pipeline explorer", "",
                  f"One change of the pipeline explorer (flashlab.widgets.pipeline: run the "
                  f"settings and their baseline, the summary, draw and encode the Gantt chart): "
                  f"median {t['median_s'] * 1e3:.0f} ms, slowest {t['max_s'] * 1e3:.0f} ms over "
                  f"{t['changes']} changes; {t['figures_built']} figure(s) built "
                  f"(target: median under {t['target_s'] * 1e3:.0f} ms)."]
    return lines


def _target_lines(result: dict) -> list[str]:
    """Every target with its status, in a code block."""
    lines = ["", "## Targets", "", "```"]
    for t in result["targets"]:
        val = "" if t["value"] is None else f" {t['value']:.3g} {t['op']} {t['threshold']:.3g}:"
        lines.append(f"{t['status']:<4} {t['name']}:{val} {t['detail']}")
    lines += ["```", ""]
    return lines


def _direction_lines(result: dict, direction: str) -> list[str]:
    """The attention cases of one direction (forward or backward) as a table."""
    lines = [f"## Attention {direction}", "",
             "Speed vs X = X's time / this time (> 1: faster); memory vs torch = this peak "
             "extra / torch's."
             + (" Backward: time of the backward alone; memory of a training step."
                if direction == "backward" else ""), ""]
    lines += _attention_table(result, direction) + [""]
    return lines


def _decode_lines(result: dict) -> list[str]:
    """Decode (one query row against a long K/V cache): flashlab, tiled, torch and plain reads."""
    lines: list[str] = []
    if result.get("decode"):
        lines += ["## Decode", "",
                  "One query row per head against a long K/V cache (GQA: H query heads, Hkv kv "
                  "heads), float32, timed in turn (median of the rounds; reads: best). flashlab "
                  "runs the split-KV kernel; 'tiled' is the tiled forward on the same problem. "
                  "Reads of K and V: numpy's one-thread np.add.reduce, and a parallel read "
                  "(flashlab.input_scan) on every thread. Speed vs torch = torch's time / "
                  "flashlab's; over read = flashlab's time / the parallel read's.", "",
                  "| Sk | H/Hkv | K+V (MB) | flashlab (ms) | GB/s | tiled (ms) | torch (ms) | "
                  "read numpy (ms) | read all threads (ms) | speed vs torch | over read |",
                  "|---:|---|---:|" + "---:|" * 8]
        for d in result["decode"]:
            sec, r = d["seconds"], decode_ratios(d)
            lines.append(
                f"| {d['sk']} | {d['heads']}/{d['kv_heads']} | {d['kv_bytes'] / MB:.0f} "
                f"| {sec['flashlab'] * 1e3:.1f} | {d['gbps']['flashlab']:.1f} "
                f"| {sec['flashlab_tiled'] * 1e3:.1f} "
                f"| {_fmt(sec.get('torch_sdpa') and sec['torch_sdpa'] * 1e3, '.1f')} "
                f"| {d['best']['read_numpy'] * 1e3:.1f} | {d['best']['read_2threads'] * 1e3:.1f} "
                f"| {_fmt(r['vs_torch'], '.2f', 'x')} | {r['over_read_2threads']:.2f} |")
        lines.append("")
    return lines


def _backward_forward_lines(result: dict) -> list[str]:
    """The backward's time over the forward's, beside their FLOP ratio."""
    lines: list[str] = []
    bwf = backward_over_forward(result)
    if bwf:
        lines += ["## Backward / forward", "",
                  "The backward's time (alone) over the forward's, and the ratio of their "
                  "matmul FLOPs (2.5 at equal head dims: 5 matmuls per tile against 2).", ""]
        lines += _backward_over_forward_table(bwf) + [""]
    return lines


def _mla_lines(result: dict, cfg: BenchConfig) -> list[str]:
    """The MLA dataflows timed whole."""
    lines: list[str] = []
    if case_table(result, section="mla", status=None):
        dn, dr, dv = cfg.mla_dims
        lines += ["## MLA", "",
                  f"DeepSeek-V3-like heads (NoPE {dn}, RoPE {dr} with one shared k_rope head, V "
                  f"{dv}), B={cfg.batch}, H={cfg.mla_heads}, non-causal. Dataflows of "
                  "flashlab.mla (baseline: expand, concat, pad V, attention at 192/192, slice; "
                  "native_v: no pad; split_rope: pad V, split accumulation, no concat; rect: "
                  "split accumulation at native dims), timed whole. "
                  "GFLOP/s of the useful work (192/128). Modelled peak: flashlab.ledgers' ledger. "
                  "The concatenated rows time flashlab and torch SDPA on ready-made 192-dim Q, K.",
                  ""]
        lines += _mla_table(result) + [""]
    return lines


def _skipped_lines(result: dict) -> list[str]:
    """Cases that were skipped or failed, then the run's notes."""
    skipped = [r for r in result["cases"] if r["status"] != "ok"]
    lines = ["## Skipped and failed cases", ""]
    # an MLA-shape attention case appears in both sections: list it once
    listed = dict.fromkeys(f"- {Case.from_dict(r).label}: {r['status']}: {r['reason']}"
                           for r in skipped)
    lines += list(listed) or ["- none"]
    lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return lines
