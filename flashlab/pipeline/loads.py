"""The load strategies: MTE2's program under ``IterateAll`` (:func:`iterate_all_loads`) and
with the kernel's own L1 management (:func:`own_mte2_loads`, ping-pong and n buffers)."""
from __future__ import annotations

from collections.abc import Callable

from flashlab.pipeline.graph_builder import FAGraphBuilder

__all__ = ["iterate_all_loads", "own_mte2_loads"]


def iterate_all_loads(b: FAGraphBuilder) -> None:
    """MTE2's program under ``IterateAll``: each matmul copies its own operands, after the
    previous matmul's Cube work (and $PV$'s after the softmax: the API is called once $P$ exists)."""
    prev = None
    for kind, t in b.corder:
        if kind == "QK":
            # split RoPE: two IterateAll calls (nope, then rope), each with its own copies
            for p in range(len(b.parts)):
                first = []
                if b.steps[t][1] == 0:
                    b.load_q(t, p)
                    first.append(("Q", b.steps[t][0], p))
                b.load_k(t, p)
                first.append(("K", t, p))
                if prev is not None:
                    for key in first:
                        b.prog.depend(key, prev)
                prev = ("MM", "QK", t, len(b.chunks(b.parts[0])) - 1)
        else:
            b.load_v(t)
            if b.gm:
                b.load_p(t)
            b.prog.depend(("V", t), ("SM", t))  # the API is called once P is ready
            if prev is not None:
                b.prog.depend(("V", t), prev)
        prev = b.last_mm(kind, t)


def own_mte2_loads(b: FAGraphBuilder) -> None:
    """MTE2's program with own copies into ``n_buffers`` L1 buffers per operand.

    The B tile ($K_t$ or $V_t$) of the matmul at Cube position $c$ is copied once the Cube
    reaches position $c - (n - 1)$ (the buffer it reuses is freed by the matmul at $c - n$);
    $P_t$ when the Cube reaches $PV_t$ (it waits for the softmax anyway). MTE2 runs in order,
    so the queue is sorted by (Cube position it is issued at, Cube position that reads it,
    B before P): everything a copy's buffer waits for is ahead of it in the queue, and the
    schedule cannot deadlock. More buffers move the B copies earlier in the queue — ahead of
    copies of $P$ that the Cube needs sooner.
    """
    pos = {mat: p for p, mat in enumerate(b.corder)}
    queue: list[tuple[tuple[float, int, int], Callable[..., None], int]] = []
    for t, (i, j) in enumerate(b.steps):
        if j == 0:
            # Q's one buffer is freed by the last QK of the previous q-block
            at = pos[("QK", t - 1)] + 0.5 if i > 0 else -1.0
            queue.append(((at, pos[("QK", t)], 0), b.load_q, t))
        for kind, load in (("QK", b.load_k), ("PV", b.load_v)):
            c = pos[(kind, t)]
            queue.append(((max(0, c - b.n_buffers + 1) - 0.5, c, 0), load, t))
        if b.gm:
            queue.append(((pos[("PV", t)] - 0.5, pos[("PV", t)], 1), b.load_p, t))
    for _, load, t in sorted(queue, key=lambda item: item[0]):
        load(t)
