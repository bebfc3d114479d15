"""The decode section: one query row per head against a long K/V cache (:func:`decode_bench`)
and its target figures (:func:`decode_ratios`).
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from flashlab.bench.runners import call_seconds

__all__ = ["decode_bench", "decode_ratios"]


def decode_bench(sk: int, *, heads: int = 32, kv_heads: int = 8, d: int = 128, sq: int = 1,
                 repeats: int = 7, torch: bool = True) -> dict:
    """Decode (``sq`` query rows against ``sk`` keys, GQA ``heads``/``kv_heads``), timed in turn.

    Implementations, each timed once per round, ``repeats`` rounds after a warm-up:
    ``flashlab`` (:func:`flashlab.flash_attention`, which runs the split-KV kernel of
    :mod:`flashlab.kernels.decode`), ``flashlab_tiled`` (the tiled forward on the same
    problem, without the split-KV kernel), ``torch_sdpa`` (``enable_gqa=True``, K and V
    not expanded) when ``torch``; and two reads of K and V that bound any decode from below,
    as decode reads every byte of K and V once: ``read_numpy`` (``np.add.reduce`` of K then
    V, one thread) and ``read_2threads`` (:func:`flashlab.input_scan.finite_and_max_sq_norm`
    on K then V, a parallel read on every Numba thread).

    Returns ``{"sk", "sq", "heads", "kv_heads", "d", "kv_bytes", "times": {impl: [...]},
    "seconds": {impl: median}, "best": {impl: min}, "gbps": {impl: kv_bytes / median}}``.
    """
    import flashlab
    from flashlab import api
    from flashlab.input_scan import finite_and_max_sq_norm

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, heads, sq, d), dtype=np.float32)
    k = rng.standard_normal((1, kv_heads, sk, d), dtype=np.float32)
    v = rng.standard_normal((1, kv_heads, sk, d), dtype=np.float32)

    def tiled():
        saved = api.uses_decode
        api.uses_decode = lambda p: False
        try:
            return flashlab.flash_attention(q, k, v)
        finally:
            api.uses_decode = saved

    fns: dict[str, Callable[[], Any]] = {
        "flashlab": lambda: flashlab.flash_attention(q, k, v),
        "flashlab_tiled": tiled,
        "read_numpy": lambda: (np.add.reduce(k, axis=None), np.add.reduce(v, axis=None)),
        "read_2threads": lambda: (finite_and_max_sq_norm(k.reshape(-1, d)),
                                  finite_and_max_sq_norm(v.reshape(-1, d))),
    }
    if torch:
        import torch as th
        import torch.nn.functional as F
        tq, tk, tv = (th.from_numpy(x) for x in (q, k, v))

        def sdpa():
            with th.no_grad():
                return F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
        fns["torch_sdpa"] = sdpa
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, f in fns.items():
            times[name].append(call_seconds(f))
    kv_bytes = k.nbytes + v.nbytes
    med = {name: statistics.median(t) for name, t in times.items()}
    return {"sk": sk, "sq": sq, "heads": heads, "kv_heads": kv_heads, "d": d,
            "kv_bytes": kv_bytes, "times": times, "seconds": med,
            "best": {name: min(t) for name, t in times.items()},
            "gbps": {name: kv_bytes / t / 1e9 for name, t in med.items()}}


def decode_ratios(row: dict) -> dict:
    """The decode target figures of one :func:`decode_bench` row.

    ``vs_torch``: torch's median time / flashlab's (> 1: faster); ``over_read_numpy`` and
    ``over_read_2threads``: flashlab's median time / the best time of that read of K and V
    (the bandwidth bound: 1.0 would be decode at the speed of a plain read);
    ``vs_tiled``: the tiled forward's time / flashlab's.
    """
    sec, best = row["seconds"], row["best"]
    fl = sec["flashlab"]
    return {"vs_torch": sec["torch_sdpa"] / fl if "torch_sdpa" in sec else None,
            "over_read_numpy": fl / best["read_numpy"],
            "over_read_2threads": fl / best["read_2threads"],
            "vs_tiled": sec["flashlab_tiled"] / fl}
