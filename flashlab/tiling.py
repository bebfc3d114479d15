"""Tile defaults: one source for the tile sizes and the backward's work split.

Pure Python (no Numba, no NumPy), so the kernels, the API, the cost model and the
benchmark all import the same numbers without importing each other.

- :data:`FORWARD_BLOCK`, :data:`BACKWARD_BLOCK`: the default ``(block_q, block_k)`` tiles;
- :func:`q_splits` with :data:`MIN_WORK_ITEMS`: how many chunks of query blocks each head of
  the backward is cut into, from the shape alone;
- :func:`kv_reread_factor`: how many times the q-block loop reads K and V, given the on-chip hit
  rate of its re-reads (:data:`KV_RESIDENT` = every re-read served on chip): the reuse
  parameter of the step ledgers (:mod:`flashlab.ledgers`) and the traffic model
  (:mod:`flashlab.traffic`).
"""
from __future__ import annotations

__all__ = ["FORWARD_BLOCK", "BACKWARD_BLOCK", "DV_SLICE_ROWS", "MIN_WORK_ITEMS", "q_splits",
           "cdiv", "DECODE_MAX_SQ", "runs_decode", "KV_RESIDENT", "check_hit_rate", "kv_reread_factor"]

#: The tiled forward is replaced by the split-KV decode kernel (:mod:`flashlab.kernels.decode`)
#: when ``Sq <= DECODE_MAX_SQ`` (and the query fits one q-block, no RoPE operands). Decode and
#: speculative decoding have Sq of 1 to ~8 (the timings that chose 16 are in the book's
#: *Measurements behind the defaults*). Here, below :mod:`flashlab.validation`, because a problem
#: of that kind has its K and V scanned lazily (:attr:`flashlab.validation.Problem.lazy_kv`).
DECODE_MAX_SQ = 16


def runs_decode(sq: int, block_q: int, has_rope: bool) -> bool:
    """Whether a forward of ``sq`` query rows in q-blocks of ``block_q`` runs the split-KV decode
    kernel: a short query (``sq <= DECODE_MAX_SQ``) that fits one q-block, without RoPE operands."""
    return sq <= DECODE_MAX_SQ and block_q >= sq and not has_rope

#: The forward's default tile sizes ``(block_q, block_k)``, chosen by timing the candidates
#: against torch SDPA in turn (the figures are in the book's *Measurements behind the
#: defaults*). A taller q-block re-reads K and V and re-packs them for BLAS fewer times, and
#: gives BLAS larger gemms; 512 x 256 keeps causal diagonal tiles small.
FORWARD_BLOCK: tuple[int, int] = (512, 256)

#: The backward's default tile sizes ``(block_q, block_k)``, chosen by timing in turn with torch
#: SDPA's backward (figures in the book's *Measurements behind the defaults*): a larger tile
#: packs each BLAS operand once for more FLOPs. Its S and dP tiles (512 KiB each) do not fit a
#: core's 1 MiB L2 with the rest.
BACKWARD_BLOCK: tuple[int, int] = (512, 256)

#: The backward adds each tile's ``P^T dO`` into dV in gemms of this many query rows
#: (:func:`flashlab.kernels.backward.add_pt_do`): one gemm over the 512 rows of a tile sums
#: 512 float32 products in one chain per entry; slices of 64 rows shorten the chain (the error
#: measured both ways is in the book's *Measurements behind the defaults*).
DV_SLICE_ROWS = 64

#: :func:`q_splits` splits the query blocks of each head until there are at least this many
#: parallel work items (a constant, never the thread count: the bits must not depend on it).
MIN_WORK_ITEMS = 4


def cdiv(a: int, b: int) -> int:
    """Ceiling division ``ceil(a / b)`` for ints: the number of ``b``-sized blocks covering ``a``."""
    return -(-a // b)


def q_splits(batch: int, heads: int, n_qblocks: int) -> int:
    """Number of query-block chunks per head: the smallest giving ``>= MIN_WORK_ITEMS`` items.

    $n_{split} = \\max(1, \\min(n_{qb}, \\lceil W / (B H) \\rceil))$ with $W$ = MIN_WORK_ITEMS.

    >>> q_splits(1, 8, 32), q_splits(1, 1, 32), q_splits(1, 2, 32), q_splits(1, 1, 3)
    (1, 4, 2, 3)
    """
    want = cdiv(MIN_WORK_ITEMS, batch * heads)
    return max(1, min(n_qblocks, want))


#: ``kv_hit = 1``: every K/V re-read of the fused kernel is served on chip (L2 or a resident
#: copy): only the compulsory traffic, one read of K and V, reaches main memory
KV_RESIDENT = 1.0


def check_hit_rate(kv_hit) -> None:
    """``ValueError`` unless ``kv_hit`` is a number in [0, 1] (a bool is not)."""
    if isinstance(kv_hit, bool) or not isinstance(kv_hit, (int, float)) or not 0.0 <= kv_hit <= 1.0:
        raise ValueError(f"kv_hit must be a number in [0, 1] (the on-chip hit rate of K/V re-reads); "
                         f"got {kv_hit!r}")


def kv_reread_factor(seq_q: int, block_q: int, kv_hit: float, *, seq_k: int | None = None,
                     causal: bool = False) -> float:
    r"""How many times the fused kernel's K and V cross the main-memory bus, per head.

    The kernel runs $n_{qb} = \lceil S_q / B_r \rceil$ q-blocks, each streaming the keys it
    attends: all $S_k$ of them, or with ``causal`` (top-left) the first $\min(i_1, S_k)$ for
    the q-block ending at row $i_1$. Together they read $F_0 S_k$ key rows ($F_0 = n_{qb}$
    without a mask). The first pass is compulsory; each re-read is served on chip with
    probability ``kv_hit`` (the L2 hit rate; 1 = K/V resident):

    $$ f = 1 + (F_0 - 1)(1 - h). $$

    >>> kv_reread_factor(4096, 128, 0.0), kv_reread_factor(4096, 128, 1.0), kv_reread_factor(4096, 128, 0.5)
    (32.0, 1.0, 16.5)
    >>> kv_reread_factor(4096, 128, 0.0, causal=True)
    16.5
    """
    check_hit_rate(kv_hit)
    sk = seq_q if seq_k is None else seq_k
    if causal:
        # q-block [i0, i1) reads keys [0, min(i1, Sk)): F0 = sum of those / Sk
        ends = [min(i0 + block_q, seq_q) for i0 in range(0, seq_q, block_q)]
        f0 = sum(min(i1, sk) for i1 in ends) / sk
    else:
        f0 = float(cdiv(seq_q, block_q))
    return 1.0 + (f0 - 1.0) * (1.0 - kv_hit)          # f = 1 + (F0 - 1)(1 - h)

