r"""Plain attention in NumPy: the float64 truth every kernel is tested against.

$$
S = \text{scale}\,(Q K^\top + Q^{rope} {K^{rope}}^\top)\ \big[\to c \tanh(S / c)\big],\qquad
P = \operatorname{softmax}_{\text{row}}(S \text{ with masked entries} = -\infty),\qquad
O = P V,\qquad \mathrm{LSE} = \log \textstyle\sum_j e^{S_{ij}}
$$

It materialises the whole ``(B, H, Sq, Sk)`` score matrix, which is exactly what
FlashAttention avoids (see the *Standard attention* chapter). The backward is the analytic one:

$$
dV = P^\top dO,\quad dP = dO\,V^\top,\quad D = \operatorname{rowsum}(dO \circ O),\quad
dS = P \circ (dP - D),\quad dQ = \text{scale}\, dS\, K,\quad dK = \text{scale}\, dS^\top Q .
$$

With a logit soft-cap $c$ (``softcap > 0``, flash_attn's and Gemma 2's) the scaled scores
become $c \tanh(S / c)$ before the bias and the mask, and $dS$ is multiplied by
$1 - \tanh^2(S / c)$ on its way to $dQ$ and $dK$ (not to the bias's gradient).
With GQA (``H > Hkv``) the heads that share a kv head add their ``dK``, ``dV``. An additive
``bias`` (and the generated ALiBi bias) enters $S$ after scaling, so its gradient is $dS$.
With dropout, $O = (Z \circ P / k) V$ with the keep mask $Z$ of :mod:`flashlab.dropout` and
$k$ the keep probability; then $dV = (Z \circ P / k)^\top dO$ and $dP = Z \circ (dO V^\top) / k$.

A row with exactly one allowed key has $P = 1$ on it, $D_i = dP_{ij}$ and so $dS = 0$; the
reference writes that 0 exactly (as the kernel does) instead of a rounding residue.
"""
from __future__ import annotations

import numpy as np

from flashlab.dropout import keep_mask, keep_probability
from flashlab.masks import allowed
from flashlab.validation import Problem, check_output_like, prepare

__all__ = ["attention_reference", "attention_reference_backward", "attention_naive"]


def _expand_heads(x: np.ndarray, h: int) -> np.ndarray:
    """(B, Hx, S, D) -> (B, h, S, D): kv head ``g`` serves query heads ``g*h/Hx .. (g+1)*h/Hx - 1``."""
    return np.repeat(x, h // x.shape[1], axis=1)


def _allowed(p: Problem) -> np.ndarray:
    """Bool (Bm, Hm, Sq, Sk): True where key j may be attended by row i."""
    B, H, _, Sq, Sk, _, _ = p.shape
    ok = allowed(Sq, Sk, p.left, p.right)[None, None]
    if p.mask is not None:
        ok = ok & ~p.mask
    return ok


def _allowed_count(p: Problem) -> np.ndarray:
    """Allowed keys per row (B, H, Sq): band, dense mask and ``-inf`` bias entries removed."""
    B, H, _, Sq, Sk, _, _ = p.shape
    ok = np.broadcast_to(_allowed(p), (B, H, Sq, Sk))
    if p.bias is not None:
        ok = ok & (p.bias != -np.inf)
    return ok.sum(axis=-1)


def _dropout(p: Problem, dtype) -> np.ndarray | None:
    """Z / k (B, H, Sq, Sk) in ``dtype``: the keep mask over the keep probability; None without dropout."""
    if p.drop_threshold == 0:
        return None
    B, H, _, Sq, Sk, _, _ = p.shape
    z = keep_mask((B, H, Sq, Sk), p.dropout_p, p.seed, p.offset)
    return z.astype(dtype) / dtype(keep_probability(p.drop_threshold))


def _add_bias(s: np.ndarray, p: Problem, dtype) -> None:
    """S += bias + the ALiBi term, in place (s (B, H, Sq, Sk))."""
    if p.bias is not None:
        s += p.bias.astype(dtype)
    if p.alibi_slopes is not None:
        Sq, Sk = s.shape[2:]
        dist = np.abs(np.arange(Sk)[None, :] - np.arange(Sq)[:, None] - p.alibi_offset)
        dist = np.sqrt(dist) if p.alibi_sqrt else dist.astype(np.float64)
        # -slope_h |j - i - c|
        s -= (p.alibi_slopes[:, :, None, None] * dist).astype(dtype)


def _scaled_scores(p: Problem, dtype) -> np.ndarray:
    """S = scale (Q K^T [+ Q_rope K_rope^T]), (B, H, Sq, Sk) in ``dtype``."""
    H = p.shape[1]
    q, k = (x.astype(dtype, copy=False) for x in (p.q, p.k))
    # S = scale (Q K^T [+ Q_rope K_rope^T])
    s = q @ _expand_heads(k, H).swapaxes(-1, -2)
    if p.q_rope is not None and p.k_rope is not None:   # given together (validation)
        s += p.q_rope.astype(dtype) @ _expand_heads(p.k_rope.astype(dtype), H).swapaxes(-1, -2)
    s *= dtype(p.scale)
    return s


def _forward(p: Problem, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(o, lse, probs) computed in ``dtype``; probs (B, H, Sq, Sk), before dropout.

    Written with in-place operations so that, as the numpy baseline of the benchmarks, it
    holds one (B, H, Sq, Sk) matrix at a time, as a careful naive implementation would.
    """
    B, H, _, Sq, Sk, _, _ = p.shape
    v = p.v.astype(dtype, copy=False)
    s = _scaled_scores(p, dtype)
    if p.scores.softcap > 0:
        # S = softcap tanh(S / softcap)   (logit soft-capping, after scaling, before the bias)
        c = dtype(p.scores.softcap)
        s /= c
        np.tanh(s, out=s)
        s *= c
    # S += bias (after scaling)
    _add_bias(s, p, dtype)
    if p.mask is not None or p.left < Sq or p.right < Sk:
        np.putmask(s, ~np.broadcast_to(_allowed(p), s.shape), -np.inf)
    # stable softmax: subtract the row max; a row with no allowed key keeps P = 0
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0).astype(dtype)
    s -= m_safe
    probs = np.exp(s, out=s)
    l = probs.sum(axis=-1, keepdims=True)
    probs /= np.where(l > 0, l, 1)
    z = _dropout(p, dtype)
    # O = (Z o P / k) V
    o = (probs if z is None else probs * z) @ _expand_heads(v, H)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(l[..., 0]), -np.inf)
    return o, lse, probs


def attention_reference(q, k, v, *, scale=None, causal=False, window=None, mask=None,
                        q_rope=None, k_rope=None, bias=None, alibi_slopes=None,
                        alibi_offset=None, alibi_sqrt=False, dropout_p=0.0, seed=0, offset=0,
                        softcap=0.0, block_q=None, block_k=None, return_probs=False):
    """Float64 attention, the truth. Same arguments and meaning as :func:`flashlab.flash_attention`.

    ``block_q``/``block_k`` are accepted so that one set of options can be passed to both, and
    ignored: the reference does not tile.

    Returns ``(o, lse)`` (or ``(o, lse, probs)`` with ``return_probs``), all float64:
    o (B, H, Sq, Dv), lse (B, H, Sq), probs (B, H, Sq, Sk) (the softmax before dropout).
    Rows with no allowed key give ``o = 0`` and ``lse = -inf``.
    """
    p = prepare(q, k, v, scale=scale, causal=causal, window=window, mask=mask,
                q_rope=q_rope, k_rope=k_rope, bias=bias, alibi_slopes=alibi_slopes,
                alibi_offset=alibi_offset, alibi_sqrt=alibi_sqrt, dropout_p=dropout_p,
                seed=seed, offset=offset, softcap=softcap)
    o, lse, probs = _forward(p, np.float64)
    return (o, lse, probs) if return_probs else (o, lse)


def attention_naive(q, k, v, *, block_q=None, block_k=None, **options):
    """The same naive algorithm in the inputs' own dtype (float16 inputs: float16 throughout).

    This is the "plain implementation in the same precision" of the tolerance rule used by
    flash-attention's tests: a kernel's error against the float64 reference may be at most
    twice this function's. It is also the numpy baseline of the benchmarks. Returns
    ``(o, lse)`` with o in the inputs' dtype and lse float64 for float64 inputs, else float32.
    """
    p = prepare(q, k, v, **options)
    o, lse, _ = _forward(p, p.dtype.type)
    # lse in the kernels' dtype: float64 for float64 inputs, float32 otherwise
    return o.astype(p.dtype), lse.astype(np.float64 if p.dtype == np.float64 else np.float32)


def attention_reference_backward(do, q, k, v, *, scale=None, causal=False, window=None,
                                 mask=None, q_rope=None, k_rope=None, bias=None,
                                 alibi_slopes=None, alibi_offset=None, alibi_sqrt=False,
                                 dropout_p=0.0, seed=0, offset=0, softcap=0.0,
                                 return_dbias=False, block_q=None, block_k=None):
    """Analytic float64 gradients of ``sum(o * do)``.

    do (B, H, Sq, Dv). Returns ``(dq, dk, dv)``, or ``(dq, dk, dv, dq_rope, dk_rope)`` when
    the rope operands are given, then ``dbias`` (bias's shape) with ``return_dbias``; dk, dv
    (and dk_rope) are summed over the query heads that share each kv (rope) head.
    """
    p = prepare(q, k, v, scale=scale, causal=causal, window=window, mask=mask,
                q_rope=q_rope, k_rope=k_rope, bias=bias, alibi_slopes=alibi_slopes,
                alibi_offset=alibi_offset, alibi_sqrt=alibi_sqrt, dropout_p=dropout_p,
                seed=seed, offset=offset, softcap=softcap)
    if return_dbias and bias is None:
        raise ValueError("return_dbias=True needs a bias (there is no gradient to return)")
    B, H, Hkv = p.shape[:3]
    # the kernel backward's rule for do (a numpy float array of o's shape, finite; any float
    # dtype, as everything here is float64)
    do = check_output_like("do", do, p, same_dtype=False).astype(np.float64)
    o, _, probs = _forward(p, np.float64)
    q64, k64, v64 = (x.astype(np.float64) for x in (p.q, p.k, p.v))
    kx, vx = _expand_heads(k64, H), _expand_heads(v64, H)
    z = _dropout(p, np.float64)
    # dV = (Z o P / k)^T dO
    dv = (probs if z is None else probs * z).swapaxes(-1, -2) @ do
    # dP = dO V^T  (with dropout: Z o dO V^T / k)
    dp = do @ vx.swapaxes(-1, -2)
    if z is not None:
        dp *= z
    # D = rowsum(dO * O)
    d = (do * o).sum(axis=-1, keepdims=True)
    # dS = P * (dP - D); exactly 0 on rows with one allowed key (module docstring)
    ds = probs * (dp - d)
    ds[_allowed_count(p) == 1] = 0.0
    dbias = ds
    if p.scores.softcap > 0:
        # through the soft-cap: d(c tanh(s / c))/ds = 1 - tanh^2(s / c)
        t = np.tanh(_scaled_scores(p, np.float64) / p.scores.softcap)
        ds = ds * (1.0 - t * t)
    # times scale for the chain rule through S = scale (Q K^T)
    ds = ds * p.scale
    # dQ = dS K ; dK = dS^T Q
    dq = ds @ kx
    dk = ds.swapaxes(-1, -2) @ q64

    def group_sum(x, heads):
        return x.reshape(B, heads, H // heads, *x.shape[2:]).sum(axis=2)

    grads = [dq, group_sum(dk, Hkv), group_sum(dv, Hkv)]
    if p.q_rope is not None and p.k_rope is not None:   # given together (validation)
        Hr = p.k_rope.shape[1]
        grads.append(ds @ _expand_heads(p.k_rope.astype(np.float64), H))
        grads.append(group_sum(ds.swapaxes(-1, -2) @ p.q_rope.astype(np.float64), Hr))
    if return_dbias and p.bias is not None:
        # dbias = dS, summed over the axes the bias broadcasts
        axes = tuple(a for a in range(4) if p.bias.shape[a] == 1)
        grads.append(dbias.sum(axis=axes, keepdims=True).reshape(np.shape(bias)))
    return tuple(grads)
