r"""Harder variants of the book's "Code it" exercises, for graded use (``make assignments``).

The book's exercises teach: several statements give the formula and the checker names the
usual slips. For marks, each has a *variant* here: a related task one step further (a batch
and a mask, a merge, the whole backward, any number of buffers, another layout or alignment),
stated by what to compute, never by the formula. A variant is graded by comparison with its
reference solution (the function of this module of the same name) on inputs drawn from a
seed, at the precision the book states (:data:`flashlab.exercises.grading.PRECISION`'s rule:
float answers to float32 precision, counts and masks exactly); the public check uses the
seed :data:`PUBLIC_SEED`, the hidden one the instructor's.

:data:`VARIANTS` maps each book exercise to its :class:`Variant`; the reference functions use
NumPy only and are written as a student would (the nbgrader source notebook shows their body
as the solution).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flashlab.exercises._core import FLOAT32_PRECISION

__all__ = ["Variant", "VARIANTS", "PUBLIC_SEED"]

#: the seed of a variant's public check (the hidden tests use the instructor's)
PUBLIC_SEED = 0
_EXACT = (1e-9, 1e-9)


# ------------------------------------------------------------------------------ solutions
def gemm_intensity(batch, m, n, k, bytes_per_element, accumulate):
    # FLOPs: batch products, each m n dot products of length k (a multiply and an add per term;
    # accumulating starts each dot product from C's value: no more operations)
    flops = batch * 2 * m * n * k
    # bytes: read A and B, write C, and read C first when accumulating into it
    elements = batch * (m * k + k * n + m * n * (2 if accumulate else 1))
    return flops / (bytes_per_element * elements)


def attention_batched(q, k, v, causal):
    # S = Q K^T / sqrt(d) over the last two axes; the leading axes broadcast
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        # top-left: query i sees key j iff j <= i
        sq, sk = s.shape[-2:]
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True) @ v


def merge_partials(o_a, lse_a, o_b, lse_b):
    # LSE = log(e^{LSE_a} + e^{LSE_b}), shifted by the larger one; a row with neither part
    # keeps LSE = -inf and O = 0
    m = np.maximum(lse_a, lse_b)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    w_a, w_b = np.exp(lse_a - m_safe), np.exp(lse_b - m_safe)
    total = w_a + w_b
    with np.errstate(divide="ignore"):
        lse = m_safe + np.log(total)
    # each part weighted by its share of the softmax mass
    share_a = np.divide(w_a, total, out=np.zeros_like(total), where=total > 0)
    share_b = np.divide(w_b, total, out=np.zeros_like(total), where=total > 0)
    return share_a[..., None] * o_a + share_b[..., None] * o_b, lse


def attention_backward(q, k, v, do):
    scale = 1 / np.sqrt(q.shape[1])
    s = scale * q @ k.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    o = p @ v
    dv = p.T @ do                                           # dV = P^T dO
    dp = do @ v.T                                           # dP = dO V^T
    ds = p * (dp - (do * o).sum(axis=1, keepdims=True))     # dS = P o (dP - rowsum(dO o O))
    return scale * ds @ k, scale * ds.T @ q, dv             # dQ, dK, dV


def band_tile_counts(sq, sk, left, right, block_q, block_k):
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    allowed = (j >= i - left) & (j <= i + right)
    empty = partial = full = 0
    for i0 in range(0, sq, block_q):
        for j0 in range(0, sk, block_k):
            tile = allowed[i0:i0 + block_q, j0:j0 + block_k]
            if not tile.any():
                empty += 1
            elif tile.all():
                full += 1
            else:
                partial += 1
    return empty, partial, full


def window_key_counts(sq, sk, causal, window_size):
    wl, wr = window_size
    if causal:
        wr = 0
    # bottom-right: query i sits at key position i + sk - sq
    pos = np.arange(sq) + sk - sq
    lo = np.zeros(sq, dtype=np.int64) if wl == -1 else np.maximum(pos - wl, 0)
    hi = np.full(sq, sk - 1) if wr == -1 else np.minimum(pos + wr, sk - 1)
    return np.maximum(hi - lo + 1, 0)


def mla_attention(q_nope, k_nope, q_rope, k_rope, v):
    scale = 1 / np.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    s = scale * (q_nope @ np.swapaxes(k_nope, -1, -2) + q_rope @ np.swapaxes(k_rope, -1, -2))
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True) @ v


def rope_interleaved(x, positions, base):
    d = x.shape[-1]
    theta = base ** (-np.arange(0, d, 2) / d)
    angle = positions[:, None] * theta
    cos, sin = np.cos(angle), np.sin(angle)
    # pair i = (x_{2i}, x_{2i+1})
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty(x.shape)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def pipeline_time_ragged(t_load, t_compute, buffers):
    load_end: list[float] = []
    compute_end: list[float] = []
    for j, (a, b) in enumerate(zip(t_load, t_compute)):
        # copy j starts after copy j-1 and once compute j-buffers has freed its buffer
        start = max(load_end[-1] if j else 0.0, compute_end[j - buffers] if j >= buffers else 0.0)
        load_end.append(start + a)
        # compute j starts after its copy and after compute j-1
        compute_end.append(max(load_end[-1], compute_end[-1] if j else 0.0) + b)
    return compute_end[-1] if compute_end else 0.0


def concat_bytes_gqa(batch, heads, kv_heads, seq_q, seq_k, d_nope, d_rope, elem):
    d = d_nope + d_rope
    q_rows, k_rows = batch * heads * seq_q, batch * kv_heads * seq_k
    # expand k_rope (B, 1, Sk, Dr) -> (B, Hkv, Sk, Dr): read once, write per key head
    expand = batch * seq_k * d_rope + k_rows * d_rope
    # concat Q and concat K: read both parts, write the whole row
    concat = q_rows * 2 * d + k_rows * 2 * d
    return elem * (expand + concat)


def attention_flops_band(b, h, sq, sk, d_qk, d_v, left, right, bottom_right):
    i = np.arange(sq)[:, None] + (sk - sq if bottom_right else 0)
    j = np.arange(sk)[None, :]
    allowed = np.ones((sq, sk), dtype=bool)
    if left is not None:
        allowed &= j >= i - left
    if right is not None:
        allowed &= j <= i + right
    return 2 * b * h * int(allowed.sum()) * (d_qk + d_v)


def window_read_bytes(seq_q, seq_k, d_qk, d_v, block_q, block_k, window):
    total = seq_q * d_qk
    for i0 in range(0, seq_q, block_q):
        i1 = min(i0 + block_q, seq_q)
        for j0 in range(0, seq_k, block_k):
            j1 = min(j0 + block_k, seq_k)
            # the block is visited iff some query i in [i0, i1) sees some key j in [j0, j1):
            # i - window <= j <= i
            if j0 <= i1 - 1 and j1 - 1 >= i0 - window:
                total += (j1 - j0) * (d_qk + d_v)
    return 4 * total


def largest_block_q(smem_bytes, block_k, d_qk, d_v, double_buffer):
    kv = block_k * (d_qk + d_v) * (2 if double_buffer else 1)
    best = 0
    for block_q in range(16, 4097, 16):
        if 4 * (block_q * d_qk + kv) <= smem_bytes:
            best = block_q
    return best


# ----------------------------------------------------------------------------- the variants
@dataclass(frozen=True)
class Variant:
    """A graded variant: the function to write, its statement, its reference and inputs."""

    name: str                                            # the function the student writes
    exercise: str                                        # the book exercise it extends
    signature: str                                       # "def f(...):" with a docstring
    statement: str                                       # plain Markdown, no formula
    reference: Callable
    inputs: Callable[[np.random.Generator], tuple]
    precision: tuple[float, float] = _EXACT


def _ints(r, n, lo, hi):
    return [int(x) for x in r.integers(lo, hi, size=n)]


def _window_side(r):
    return -1 if r.random() < 0.3 else int(r.integers(0, 20))


def _partials(r):
    rows, dv = int(r.integers(1, 8)), int(r.integers(1, 5))
    # LSEs in the hundreds, either sign: e^{LSE} overflows or underflows float64 in some rows
    lse_a, lse_b = (r.standard_normal(rows) * 5 + r.choice([-800.0, 0.0, 800.0], size=rows) for _ in "ab")
    lse_a[r.random(rows) < 0.25] = -np.inf                 # rows where a part saw no key
    lse_b[r.random(rows) < 0.25] = -np.inf
    o_a = np.where(np.isneginf(lse_a)[:, None], 0.0, r.standard_normal((rows, dv)))
    o_b = np.where(np.isneginf(lse_b)[:, None], 0.0, r.standard_normal((rows, dv)))
    return o_a, lse_a, o_b, lse_b


def _batched(r):
    lead = tuple(_ints(r, int(r.integers(0, 3)), 1, 4))
    sq, sk, d, dv = _ints(r, 4, 1, 9)
    sk = max(sk, 1)
    return (r.standard_normal(lead + (sq, d)) * 3, r.standard_normal(lead + (sk, d)),
            r.standard_normal(lead + (sk, dv)), bool(r.random() < 0.5))


def _mla(r):
    b, h, sq, sk = _ints(r, 4, 1, 4)
    dn, dr, dv = int(r.integers(2, 9)), int(r.integers(1, 5)), int(r.integers(1, 6))
    return (r.standard_normal((b, h, sq, dn)), r.standard_normal((b, h, sk, dn)),
            r.standard_normal((b, h, sq, dr)), r.standard_normal((b, 1, sk, dr)),
            r.standard_normal((b, h, sk, dv)))


def _backward(r):
    sq, sk, d, dv = _ints(r, 4, 1, 9)
    return (r.standard_normal((sq, d)), r.standard_normal((sk, d)), r.standard_normal((sk, dv)),
            r.standard_normal((sq, dv)))


def _rope(r):
    s, half = int(r.integers(1, 10)), int(r.integers(1, 6))
    lead = tuple(_ints(r, int(r.integers(0, 2)), 1, 3))
    return (r.standard_normal(lead + (s, 2 * half)), r.integers(0, 5000, size=s),
            float(r.choice([10000.0, 500000.0, 100.0])))


def _ragged(r):
    n = int(r.integers(1, 12))
    return list(r.uniform(0.1, 5, size=n)), list(r.uniform(0.1, 5, size=n)), int(r.integers(1, 5))


def _gqa(r):
    heads = int(r.choice([8, 16, 32, 128]))
    return (int(r.integers(1, 16)), heads, int(r.choice([1, 2, 4, 8])), *_ints(r, 2, 1, 8192),
            int(r.integers(16, 256)), int(r.integers(8, 128)), int(r.choice([1, 2, 4])))


def _side_or_none(r):
    return None if r.random() < 0.25 else int(r.integers(-3, 30))


VARIANTS: dict[str, Variant] = {v.exercise: v for v in (
    Variant("gemm_intensity", "arithmetic_intensity",
            'def gemm_intensity(batch, m, n, k, bytes_per_element, accumulate):\n'
            '    """FLOP per byte of HBM traffic of `batch` independent products A @ B (A m x k, B k x n)."""',
            "Write `gemm_intensity(batch, m, n, k, bytes_per_element, accumulate)`: the arithmetic "
            "intensity (FLOP per byte of HBM traffic) of `batch` independent matrix products "
            "$A B$, $A$ of shape $(m, k)$ and $B$ $(k, n)$, each element `bytes_per_element` bytes. "
            "With `accumulate=False` the kernel writes $C = AB$; with `accumulate=True` it updates "
            "$C \\mathrel{+}= AB$ in place. Count what the kernel must read and write, each matrix "
            "once, and the multiply-adds of the products, two FLOPs each (accumulating starts each dot "
            "product from $C$'s value: no further operation). Return a float.",
            gemm_intensity,
            lambda r: (int(r.integers(1, 9)), *_ints(r, 3, 1, 4096), int(r.choice([1, 2, 4, 8])),
                       bool(r.random() < 0.5)),
            (1e-9, 1e-12)),
    Variant("attention_batched", "attention",
            'def attention_batched(q, k, v, causal):\n'
            '    """q (..., Sq, d), k (..., Sk, d), v (..., Sk, dv) -> o (..., Sq, dv); causal: top-left."""',
            "Write `attention_batched(q, k, v, causal)`: standard scaled dot-product attention over "
            "the last two axes of its arguments, for any number of leading (batch, head) axes, "
            "which broadcast. With `causal=True` query $i$ attends only the keys $j \\le i$ "
            "(top-left alignment). It must not overflow for scores in the thousands, and must "
            "return no NaN.",
            attention_batched, _batched, FLOAT32_PRECISION),
    Variant("merge_partials", "online_softmax_step",
            'def merge_partials(o_a, lse_a, o_b, lse_b):\n'
            '    """Two partial results of one attention over disjoint key sets -> (o, lse) over both."""',
            "Split-K: the keys of an attention are split into two disjoint sets, and each part "
            "returns its normalised output and its log-sum-exp per row: `o_a` $(S_q, d_v)$, "
            "`lse_a` $(S_q,)$, and `o_b`, `lse_b`. A part that saw no key for a row returns "
            "$\\mathrm{LSE} = -\\infty$ and a zero row. Write `merge_partials(o_a, lse_a, o_b, lse_b)` "
            "returning `(o, lse)` of the attention over all the keys, from these four arrays only, "
            "without overflow for LSEs in the hundreds, and with $(0, -\\infty)$ for a row neither "
            "part saw.",
            merge_partials, _partials, FLOAT32_PRECISION),
    Variant("attention_backward", "softmax_grad",
            'def attention_backward(q, k, v, do):\n'
            '    """q (Sq, d), k (Sk, d), v (Sk, dv), do (Sq, dv) -> (dq, dk, dv)."""',
            "Write `attention_backward(q, k, v, do)`: the gradients `(dq, dk, dv)` of the loss with "
            "respect to $Q$, $K$ and $V$ for one head of standard attention "
            "$O = \\operatorname{softmax}(QK^\\top/\\sqrt d)\\,V$ (no mask), given `do`, the "
            "gradient of the loss with respect to $O$. Derive the chain rule yourself; recompute "
            "whatever forward quantities you need.",
            attention_backward, _backward, FLOAT32_PRECISION),
    Variant("band_tile_counts", "band_mask",
            'def band_tile_counts(sq, sk, left, right, block_q, block_k):\n'
            '    """(empty, partial, full): how many tiles of the band mask are in each class."""',
            "A kernel skips the tiles the mask removes entirely and drops the mask test in the "
            "tiles it keeps entirely. Write `band_tile_counts(sq, sk, left, right, block_q, block_k)` "
            "returning the tuple `(empty, partial, full)`: how many `block_q` x `block_k` tiles of "
            "the $(S_q, S_k)$ score matrix (the last row and column of tiles may be cut short) hold "
            "no allowed entry, some, or only allowed entries, under the chapter's band (query $i$ "
            "sees the keys from `left` before its own position to `right` after it, both edges "
            "included; either may be negative).",
            band_tile_counts,
            lambda r: (*_ints(r, 2, 1, 60), *(int(x) for x in r.integers(-8, 50, size=2)),
                       *(int(x) for x in r.choice([1, 3, 4, 8, 16], size=2)))),
    Variant("window_key_counts", "window_band",
            'def window_key_counts(sq, sk, causal, window_size):\n'
            '    """(sq,) int: how many keys each query attends under flash_attn\'s convention."""',
            "Write `window_key_counts(sq, sk, causal, window_size)`: for each query row, how many "
            "keys it attends under flash_attn's conventions (causal and the window aligned to the "
            "bottom-right corner, `window_size = (left, right)` with `-1` unbounded, `causal` "
            "setting the right side to 0). A row that attends no key counts 0. Return an integer "
            "array of shape `(sq,)`.",
            window_key_counts,
            lambda r: (*_ints(r, 2, 1, 40), bool(r.random() < 0.4), (_window_side(r), _window_side(r)))),
    Variant("mla_attention", "mla_scores",
            'def mla_attention(q_nope, k_nope, q_rope, k_rope, v):\n'
            '    """MLA\'s attention output (B, H, Sq, Dv); k_rope (B, 1, Sk, Dr) is shared by the heads."""',
            "Write `mla_attention(q_nope, k_nope, q_rope, k_rope, v)`: the output of MLA's attention "
            "(no mask) for `q_nope` $(B, H, S_q, D_n)$, `k_nope` $(B, H, S_k, D_n)$, `q_rope` "
            "$(B, H, S_q, D_r)$, `k_rope` $(B, 1, S_k, D_r)$ (one RoPE key head for all heads) and "
            "`v` $(B, H, S_k, D_v)$, scaled as the chapter's operator scales it, without "
            "concatenating or copying `k_rope` per head.",
            mla_attention, _mla, FLOAT32_PRECISION),
    Variant("rope_interleaved", "rope_rotate_half",
            'def rope_interleaved(x, positions, base):\n'
            '    """RoPE in the interleaved (GPT-J) layout: x (..., S, D), positions (S,), any base."""',
            "Write `rope_interleaved(x, positions, base)`: rotary position embedding in the "
            "*interleaved* layout used by GPT-J and by Ascend's interleave mode, where the pair $i$ "
            "is the features $2i$ and $2i + 1$ (not $i$ and $i + D/2$), with the chapter's "
            "frequencies computed from `base` instead of 10000, for `x` of shape $(\\ldots, S, D)$ "
            "(any leading axes) and integer `positions` $(S,)$.",
            rope_interleaved, _rope, FLOAT32_PRECISION),
    Variant("pipeline_time_ragged", "pipeline_time",
            'def pipeline_time_ragged(t_load, t_compute, buffers):\n'
            '    """Makespan of tiles whose copy and compute times differ, with `buffers` buffers."""',
            "Tiles pass a copy stage and a compute stage as in the chapter, but each tile has its "
            "own times: `t_load[j]` and `t_compute[j]`. A copy needs a free buffer (there are "
            "`buffers` of them, any number from 1); a computation frees its tile's buffer when it "
            "ends; each stage handles one tile at a time, in order. Write "
            "`pipeline_time_ragged(t_load, t_compute, buffers)`: the time from the first copy's "
            "start to the last computation's end (0 for no tiles).",
            pipeline_time_ragged, _ragged, (1e-9, 1e-9)),
    Variant("concat_bytes_gqa", "concat_bytes",
            'def concat_bytes_gqa(batch, heads, kv_heads, seq_q, seq_k, d_nope, d_rope, elem):\n'
            '    """Bytes read + written by expand k_rope, concat Q and concat K, with kv_heads key heads."""',
            "The same three operators as the chapter's (expand `k_rope`, concatenate Q, concatenate "
            "K), now with grouped-query attention and unequal lengths: Q has `heads` heads of "
            "`seq_q` rows, K has `kv_heads` heads of `seq_k` rows, and `k_rope` $(B, 1, S_k, D_r)$ "
            "is expanded to the `kv_heads` key heads only. Write `concat_bytes_gqa(...)`: the HBM "
            "bytes the three operators read plus write.",
            concat_bytes_gqa,
            _gqa),
    Variant("attention_flops_band", "attention_flops",
            'def attention_flops_band(b, h, sq, sk, d_qk, d_v, left, right, bottom_right):\n'
            '    """FLOPs of QK^T and PV over the pairs a band mask allows (None: unbounded side)."""',
            "Write `attention_flops_band(b, h, sq, sk, d_qk, d_v, left, right, bottom_right)`: the "
            "forward's FLOPs ($QK^\\top$ and $PV$) over the (query, key) pairs a band allows, for "
            "`b * h` heads: query $i$ sees the keys from `left` before its position to `right` after "
            "it (`None`: unbounded; either may be negative), where its position is $i$ "
            "(top-left) or $i + S_k - S_q$ (`bottom_right=True`). Return an integer.",
            attention_flops_band,
            lambda r: (*_ints(r, 2, 1, 8), *_ints(r, 2, 1, 300), *_ints(r, 2, 8, 256),
                       _side_or_none(r), _side_or_none(r), bool(r.random() < 0.5))),
    Variant("window_read_bytes", "forward_read_bytes",
            'def window_read_bytes(seq_q, seq_k, d_qk, d_v, block_q, block_k, window):\n'
            '    """Bytes the fused forward reads under a causal sliding window of `window` keys."""',
            "Count the forward's reads again, now for a causal sliding window: query $i$ sees the keys "
            "from $i$ - `window` to $i$ (top-left alignment). As in the chapter, each query block "
            "reads its $Q_i$ once and loads whole (cut at $S_k$) every key block in which some of "
            "its queries sees some key, and skips the others; float32. Write "
            "`window_read_bytes(seq_q, seq_k, d_qk, d_v, block_q, block_k, window)`.",
            window_read_bytes,
            lambda r: (*_ints(r, 2, 1, 300), *_ints(r, 2, 1, 256),
                       *(int(x) for x in r.choice([8, 16, 32, 64, 128], size=2)), int(r.integers(0, 200)))),
    Variant("largest_block_q", "shared_bytes",
            'def largest_block_q(smem_bytes, block_k, d_qk, d_v, double_buffer):\n'
            '    """The largest block_q (a multiple of 16, at most 4096) whose tiles fit smem_bytes."""',
            "The kernel of the chapter keeps $Q_i$, $K_j$ and $V_j$ in shared memory (float32). "
            "With `double_buffer=True` it keeps two $K_j$ and two $V_j$ tiles (the next ones load "
            "while the current ones are used). Write `largest_block_q(smem_bytes, block_k, d_qk, "
            "d_v, double_buffer)`: the largest query block, a multiple of 16 up to 4096, whose "
            "tiles fit in `smem_bytes` bytes; 0 if none does.",
            largest_block_q,
            lambda r: (int(r.choice([48, 64, 100, 164, 228])) * 1024, int(r.choice([16, 32, 64, 128])),
                       *_ints(r, 2, 16, 257), bool(r.random() < 0.5))),
)}
