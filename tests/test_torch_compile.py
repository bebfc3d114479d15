"""flashlab.torch_attention under ``torch.compile``: a small GPT trained with the eager,
aot_eager and inductor backends gives the same losses as uncompiled; needs torch.

The attention is two registered custom ops (``flashlab::flash_attn_forward`` and
``flashlab::flash_attn_backward``): Dynamo must not trace into Numba. Also: torch.func
transforms and double backward refuse with a ``NotImplementedError``, and
``torch.library.opcheck`` accepts both ops (schema, fake implementation, autograd
registration).

CI time (2-core machine, warm Numba cache): the inductor case is the slow one (it compiles
C++ with gcc, ~20-40 s the first time in a process); the others take a few seconds.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch front door needs torch (requirements-bench.txt)")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from flashlab import torch_attention  # noqa: E402
from flashlab.torch_attention import flash_attn_func  # noqa: E402


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention with its SDPA call swapped for flashlab's (2 lines, (B, T, H, D))."""

    def __init__(self, d: int, heads: int, use_flashlab: bool):
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.heads, self.use_flashlab = heads, use_flashlab

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads) for t in (q, k, v))
        if self.use_flashlab:
            y = flash_attn_func(q, k, v, causal=True)
        else:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True).transpose(1, 2)
        return self.c_proj(y.reshape(B, T, C))


class GPT(nn.Module):
    """A few pre-LN blocks (attention + MLP) over token and position embeddings."""

    def __init__(self, vocab=16, d=32, heads=4, layers=2, T=16, use_flashlab=True):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict(dict(
                ln1=nn.LayerNorm(d), attn=CausalSelfAttention(d, heads, use_flashlab),
                ln2=nn.LayerNorm(d), mlp=nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(),
                                                       nn.Linear(4 * d, d)))))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = x + b["attn"](b["ln1"](x))
            x = x + b["mlp"](b["ln2"](x))
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def train(backend: str | None, steps: int = 4, use_flashlab: bool = True) -> list[float]:
    """``steps`` AdamW steps of the small GPT from seed 0, compiled with ``backend`` (None: eager)."""
    torch.manual_seed(0)
    model = GPT(use_flashlab=use_flashlab)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 16, (steps, 4, 17), generator=g)
    step = model if backend is None else torch.compile(model, backend=backend, fullgraph=True)
    losses = []
    for s in range(steps):
        loss = step(data[s, :, :-1], data[s, :, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.fixture(scope="module")
def eager_losses():
    torch._dynamo.reset()
    return train(None)


def test_uncompiled_matches_sdpa(eager_losses):
    """The baseline of the compiled runs is itself right: SDPA's losses, to float32 rounding."""
    np.testing.assert_allclose(eager_losses, train(None, use_flashlab=False), rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_gpt_trains_like_uncompiled(backend, eager_losses):
    """fullgraph=True: the attention is two opaque op nodes, no graph break, no Numba traced.
    inductor: slow (compiles C++ with gcc, tens of seconds)."""
    torch._dynamo.reset()
    losses = train(backend)
    # the same kernels on the same inputs; only the compiled rest of the model may round
    # differently (inductor fuses LayerNorm/GELU)
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-5 if backend == "inductor" else 0)


def test_opcheck_both_ops():
    """torch.library.opcheck: schema, fake (meta) implementation and autograd registration."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 5, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    torch.library.opcheck(torch_attention._forward_op,
                          (q, k, v, 0.0, None, True, -1, -1, 0.0, None, False))
    out, lse, seed, _ = torch_attention._forward_op(q, k, v, 0.0, None, True, -1, -1, 0.0, None, False)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch_attention._backward_op,
                          (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, seed,
                           0.0, None, True, -1, -1, 0.0, None),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_func_and_double_backward_are_refused_clearly():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    with pytest.raises(NotImplementedError, match="torch.func transforms"):
        torch.func.grad(lambda a: flash_attn_func(a, k, v).sum())(q)
    with pytest.raises(NotImplementedError, match="torch.func transforms"):
        torch.vmap(lambda a: flash_attn_func(a, k, v))(q[None].expand(2, -1, -1, -1, -1))
    out = flash_attn_func(q, k, v, causal=True)
    gq, = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(NotImplementedError, match="no double backward"):
        gq.sum().backward()


# ------------------------------------------------------------------------------ dynamic shapes
#: five sequence lengths, none equal to the head dim (Dynamo's duck sizing would tie them)
_LENGTHS = (5, 9, 13, 17, 21)


def _attend(q, k, v):
    """The door as training code calls it: a softmax_scale computed from a (symbolic) shape."""
    return flash_attn_func(q, k, v, causal=True, softmax_scale=q.shape[-1] ** -0.5)


def _step(fn, S: int, mark: bool = False):
    """``(out, dq, dk, dv)`` of one forward + backward at sequence length ``S`` (fixed data)."""
    g = torch.Generator().manual_seed(S)
    q, k, v = (torch.randn(2, S, 3, 4, generator=g, requires_grad=True) for _ in range(3))
    if mark:
        for t in (q, k, v):
            torch._dynamo.mark_dynamic(t, 1)
    out = fn(q, k, v)
    out.backward(torch.randn(out.shape, generator=g))
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("mark", [False, True], ids=["dynamic", "mark_dynamic"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_dynamic_shapes_compile_in_at_most_two_graphs(backend, mark):
    """fullgraph=True with dynamic=True (or mark_dynamic on the sequence axis): the scalar
    checks trace (a SymFloat softmax_scale is compared, never passed to math.isfinite), five
    sequence lengths take at most 2 graphs, and forward and backward give eager's bits."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(_attend, backend=counter, fullgraph=True,
                             dynamic=None if mark else True)
    for S in _LENGTHS:
        got, want = _step(compiled, S, mark), _step(_attend, S)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            assert torch.equal(a, b), f"{backend} S={S}: {name} differs from eager"
    assert 1 <= counter.frame_count <= 2, f"{counter.frame_count} graphs for {len(_LENGTHS)} lengths"
