r"""Rotary position embedding (RoPE) and MLA's decoupled RoPE.

**RoPE** (Su et al., *RoFormer*, 2021) encodes the position $m$ of a token by rotating pairs of
its features. Feature pair $i$ ($i = 0, \dots, D/2 - 1$) turns by the angle $m\,\theta_i$ with

$$
\theta_i = \text{base}^{-2i/D}, \qquad \text{base} = 10000 \text{ by default.}
$$

Writing the pair $(a_i, b_i)$ as one complex number $z_i = a_i + \mathrm{i}\, b_i$, the rotation
is a single multiplication:

$$
z_i' = z_i\, e^{\mathrm{i}\, m \theta_i}
\quad\Longleftrightarrow\quad
\begin{pmatrix} a_i' \\ b_i' \end{pmatrix} =
\begin{pmatrix} \cos m\theta_i & -\sin m\theta_i \\ \sin m\theta_i & \cos m\theta_i \end{pmatrix}
\begin{pmatrix} a_i \\ b_i \end{pmatrix}.
$$

**Why attention likes it.** For a query at position $m$ and a key at position $n$,

$$
\langle R_m q, R_n k \rangle = \operatorname{Re} \sum_i z^q_i\, \overline{z^k_i}\, e^{\mathrm{i}(m - n)\theta_i},
$$

which depends on the positions only through $m - n$: the score sees relative positions.

**Two conventions** pair the features differently (same math, different memory layout; a
checkpoint trained with one gives wrong results with the other):

- *rotate-half* (GPT-NeoX, Hugging Face Llama): pair $i$ is $(x_i, x_{i + D/2})$;
- *interleaved* (GPT-J, the original RoFormer, Meta's Llama reference code, DeepSeek-V3's
  inference code): pair $i$ is $(x_{2i}, x_{2i+1})$.

:func:`pair_indices` is the only place the two differ.

**MLA's decoupled RoPE** (DeepSeek-V2, arXiv:2405.04434, section *Decoupled Rotary Position
Embedding*). MLA caches one compressed latent per token and folds the key up-projection into
the query; a rotation between them would block that folding. So RoPE acts on a separate, small
part: each head $h$ gets its own rotated query part $q^R_h$, while the key part $k^R$ is
computed once per token and **shared by all heads**. Each head's query and key are the
concatenations $[q^C_h; q^R_h]$ and $[k^C_h; k^R]$, so its score is

$$
s_h = q^C_h \cdot k^C_h + q^R_h \cdot k^R .
$$

The RECT-FA operator takes the two parts as separate operands and accumulates the second
product into the first (see :mod:`flashlab.mla`). DeepSeek-V3's sizes are the constants below;
its long-context YaRN rescaling of the frequencies is not modelled here.
"""
from __future__ import annotations

import numpy as np

from flashlab.arguments import as_int, as_real

__all__ = ["DEEPSEEK_V3_NOPE_DIM", "DEEPSEEK_V3_ROPE_DIM", "DEEPSEEK_V3_V_DIM",
           "DEEPSEEK_V3_HEADS", "DEEPSEEK_V3_ROPE_BASE", "DEFAULT_BASE", "rope_frequencies",
           "pair_indices", "apply_rope", "mla_rope"]

#: DeepSeek-V3 per-head sizes, from config.json of deepseek-ai/DeepSeek-V3 (``qk_nope_head_dim``,
#: ``qk_rope_head_dim``, ``v_head_dim``, ``num_attention_heads``, ``rope_theta``) and the
#: DeepSeek-V3 Technical Report (arXiv:2412.19437), *Hyper-Parameters* (d_h = 128,
#: d_h^R = 64, n_h = 128). Q/K head dim 128 + 64 = 192 and V head dim 128 are the
#: "D1 = 192, D2 = 128" of the Ascend RECT-FA article (2025-06-25).
DEEPSEEK_V3_NOPE_DIM = 128
DEEPSEEK_V3_ROPE_DIM = 64
DEEPSEEK_V3_V_DIM = 128
DEEPSEEK_V3_HEADS = 128
DEEPSEEK_V3_ROPE_BASE = 10000.0

#: the usual RoPE base (RoFormer; Llama 1/2; DeepSeek-V3's ``rope_theta``)
DEFAULT_BASE = 10000.0


def _check_dim(dim) -> int:
    dim = as_int("dim", dim, lo=2, what="an even int >= 2")
    if dim % 2:
        raise ValueError(f"dim must be an even int >= 2 (features are rotated in pairs); got {dim}")
    return dim


def _check_base(base) -> float:
    return as_real("base", base, lo=1.0, lo_open=True, what="a real number > 1")


def rope_frequencies(dim: int, base: float = DEFAULT_BASE) -> np.ndarray:
    """The angular frequencies ``theta`` of the ``dim // 2`` feature pairs, float64.

    >>> rope_frequencies(4, base=100.0)
    array([1. , 0.1])
    """
    dim = _check_dim(dim)
    base = _check_base(base)
    i = np.arange(dim // 2, dtype=np.float64)
    # theta_i = base^{-2i/D}
    return base ** (-2.0 * i / dim)


def pair_indices(dim: int, interleaved: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Feature indices ``(a, b)`` of the ``dim // 2`` rotated pairs: pair ``i`` is ``(a[i], b[i])``.

    rotate-half: ``a = 0 .. D/2-1``, ``b = D/2 .. D-1``; interleaved: ``a = 0, 2, ..``, ``b = 1, 3, ..``.

    >>> pair_indices(6)
    (array([0, 1, 2]), array([3, 4, 5]))
    >>> pair_indices(6, interleaved=True)
    (array([0, 2, 4]), array([1, 3, 5]))
    """
    dim = _check_dim(dim)
    if interleaved:
        return np.arange(0, dim, 2), np.arange(1, dim, 2)
    return np.arange(dim // 2), np.arange(dim // 2, dim)


def _positions(positions, shape: tuple[int, ...]) -> np.ndarray:
    """Integer positions broadcastable to ``shape`` (``x.shape[:-1]``); default ``arange(S)``."""
    if positions is None:
        return np.arange(shape[-1])
    positions = np.asarray(positions)
    if not np.issubdtype(positions.dtype, np.integer):
        raise TypeError(f"positions must be an integer array (token positions); got dtype {positions.dtype}")
    try:
        ok = np.broadcast_shapes(positions.shape, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"positions of shape {positions.shape} must broadcast to x.shape[:-1] = "
                         f"{shape} (e.g. shape (S,) for one position per token)")
    return positions


def apply_rope(x: np.ndarray, positions=None, *, base: float = DEFAULT_BASE,
               interleaved: bool = False) -> np.ndarray:
    """Rotate the feature pairs of ``x`` by ``position * theta``; returns a new array.

    Parameters
    ----------
    x : (..., S, D) float16/32/64 with ``D`` even, e.g. (B, H, S, D)
    positions : int array broadcastable to ``x.shape[:-1]``: shape (S,) for one position per
        token, (B, 1, S) for per-sequence positions, ...; any integers (negative too).
        Default ``arange(S)``.
    base : the frequency base (``rope_theta``), > 1
    interleaved : pair ``(x_{2i}, x_{2i+1})`` (GPT-J/RoFormer) instead of ``(x_i, x_{i+D/2})``

    Returns
    -------
    (..., S, D) in x's dtype. Angles and the rotation are computed in float64 (angles of
    large positions lose their accuracy fast in float32) and rounded once at the end.
    """
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a numpy.ndarray of shape (..., S, D); got {type(x).__name__}")
    if x.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"x must be float16, float32 or float64; got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., S, D) (at least 2 dims); got shape {x.shape}")
    if not isinstance(interleaved, (bool, np.bool_)):
        raise TypeError(f"interleaved must be a bool; got {interleaved!r}")
    dim = x.shape[-1]
    if dim < 2 or dim % 2:
        raise ValueError(f"x's last dim D must be even and >= 2 (pairs are rotated); got {dim}")
    pos = _positions(positions, x.shape[:-1])
    theta = rope_frequencies(dim, base)
    # angle[..., i] = m theta_i      (shape positions.shape + (D/2,))
    angle = pos[..., None].astype(np.float64) * theta
    cos, sin = np.cos(angle), np.sin(angle)
    a_idx, b_idx = pair_indices(dim, bool(interleaved))
    a = x[..., a_idx].astype(np.float64)
    b = x[..., b_idx].astype(np.float64)
    out = np.empty(x.shape, dtype=np.float64)
    # a' = a cos(m theta) - b sin(m theta)
    out[..., a_idx] = a * cos - b * sin
    # b' = a sin(m theta) + b cos(m theta)
    out[..., b_idx] = a * sin + b * cos
    return out.astype(x.dtype)


def mla_rope(q_rope: np.ndarray, k_rope: np.ndarray, q_positions=None, k_positions=None, *,
             base: float = DEEPSEEK_V3_ROPE_BASE,
             interleaved: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """MLA's decoupled RoPE: rotate every head's ``q_rope`` and the shared ``k_rope``.

    Parameters
    ----------
    q_rope : (B, H, Sq, Dr), one rope part per query head (DeepSeek-V3: Dr = 64)
    k_rope : (B, Hr, Sk, Dr) with ``H % Hr == 0``; MLA has ``Hr = 1``: one key rope part per
        token, read by every head and never copied per head
    q_positions, k_positions : int arrays of shape (Sq,) and (Sk,) (or broadcastable as in
        :func:`apply_rope`); default ``arange``. For decoding, ``q_positions`` starts after
        the cached keys.
    base, interleaved : as in :func:`apply_rope`

    Returns
    -------
    ``(q_rope', k_rope')`` with the input shapes and dtypes; the shared key is rotated once.
    """
    for name, x, shape in (("q_rope", q_rope, "(B, H, Sq, Dr)"), ("k_rope", k_rope, "(B, Hr, Sk, Dr)")):
        if not isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a numpy.ndarray of shape {shape}; got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name} must have shape {shape} (4 dims); got shape {x.shape}")
    B, H, _, Dr = q_rope.shape
    if k_rope.shape[0] != B or k_rope.shape[3] != Dr:
        raise ValueError(f"k_rope must have shape (B, Hr, Sk, Dr) = ({B}, Hr, Sk, {Dr}) as q_rope; "
                         f"got {k_rope.shape}")
    if H % k_rope.shape[1] != 0:
        raise ValueError(f"q_rope's heads H={H} must be a multiple of k_rope's heads "
                         f"Hr={k_rope.shape[1]} (MLA: Hr = 1)")
    return (apply_rope(q_rope, q_positions, base=base, interleaved=interleaved),
            apply_rope(k_rope, k_positions, base=base, interleaved=interleaved))
