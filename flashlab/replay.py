"""Replay a simulated schedule with real data: does double buffering still compute attention?

The simulator (:mod:`flashlab.pipeline.simulate`) only moves tasks in time; the schedule is
correct as long as no MTE2 copy overwrites an L1 buffer before MTE1 has read it. This module
checks that with numbers: it replays the timeline, letting

* each MTE2 copy (``load_k``/``load_v``) write its tile into the L1 slot the simulator gave
  it, **from the moment the copy starts** (the most pessimistic reading of a copy in flight);
* each MTE1 chunk read ``base_k`` columns of ``K`` (or ``base_k`` rows of ``V``) from the slot
  its copy filled, **at the moment the read ends**;

and returns the tiles the Cube received. :func:`attention_from_tiles` runs the kernel's own
online-softmax update over them; a race shows up as an output that differs from
:func:`flashlab.attention_reference`.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flashlab.kernels import tile
from flashlab.pipeline.simulate import SimResult

__all__ = ["replay_tiles", "attention_from_tiles"]


def _is_copy(task) -> bool:
    return task.engine == "MTE2" and task.kind in ("load_k", "load_v")


def replay_tiles(result: SimResult, k: np.ndarray, v: np.ndarray, block_k: int, *, base_k: int = 64,
                 slot: Callable[[int], int] | None = None) -> dict[tuple[str, int], np.ndarray]:
    """The K and V tiles the Cube received in each kv-step of a simulated schedule.

    result : the simulation of a ``build_fa_graph`` loop over ``len(k) // block_k`` kv-blocks
    k : (Sk, Dqk) and v : (Sk, Dv), one head's keys and values
    block_k : rows per kv-block; base_k : the chunk width of ``build_fa_graph`` (its default 64)
    slot : ``slot(i)`` -> the L1 slot copy task ``i`` writes; default the simulator's choice
    (pass ``lambda i: 0`` to see what a single shared buffer would do)

    Returns ``{("K", step): (block_k, Dqk) tile, ("V", step): (block_k, Dv) tile}``.
    Copies overwrite at their start and reads see the slot at their end; at equal times reads
    come first (a read that ends when a copy starts got the old tile).
    """
    tasks = result.graph.tasks
    slot = slot or (lambda i: result.slot_of[i][0])
    events = sorted([(result.start[i], 1, i) for i, t in enumerate(tasks) if _is_copy(t)]
                    + [(result.end[i], 0, i) for i, t in enumerate(tasks) if t.engine == "MTE1"])
    width = max(k.shape[1], v.shape[1])
    l1: dict[int, np.ndarray] = {}
    got: dict[tuple[str, int], np.ndarray] = {}
    for _, _, i in events:
        t = tasks[i]
        if _is_copy(t):
            # MTE2: GM -> L1 slot, the whole kv-tile
            tile = (k if t.kind == "load_k" else v)[t.step * block_k:(t.step + 1) * block_k]
            buf = l1.setdefault(slot(i), np.zeros((block_k, width)))
            buf[:, :tile.shape[1]] = tile
            continue
        # MTE1: chunk c of the tile its copy filled, L1 -> L0 (what the Cube multiplies)
        buf = l1[slot(next(d for d in t.deps if _is_copy(tasks[d])))]
        c = int(t.name.split(".")[1])
        part = slice(base_k * c, base_k * (c + 1))
        if t.kind == "qk":        # S = Q K^T: chunk c of K along the head dim
            got.setdefault(("K", t.step), np.zeros_like(k[:block_k]))[:, part] = buf[:, part]
        else:                     # O += P V: chunk c of V along the keys
            got.setdefault(("V", t.step), np.zeros_like(v[:block_k]))[part] = buf[part, :v.shape[1]]
    return got


def attention_from_tiles(tiles: dict[tuple[str, int], np.ndarray], q: np.ndarray, n_steps: int,
                         scale: float) -> np.ndarray:
    """Attention of ``q`` (Sq, Dqk) over the replayed tiles, with the kernel's own update.

    Runs ``tile.online_softmax_update`` over steps ``0 .. n_steps - 1`` and
    ``tile.finalize_rows``; returns ``o`` (Sq, Dv) in float64.
    """
    m, l = np.full(len(q), -np.inf), np.zeros(len(q))
    acc = np.zeros((len(q), tiles["V", 0].shape[1]))
    for step in range(n_steps):
        # S = scale Q K_step^T
        s = scale * (q @ tiles["K", step].T)
        tile.online_softmax_update(s, tiles["V", step], m, l, acc)
    o, lse = np.empty_like(acc), np.empty(len(q), dtype=np.float32)
    tile.finalize_rows(m, l, acc, o, lse)
    return o
