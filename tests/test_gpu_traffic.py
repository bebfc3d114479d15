"""Counted global-memory traffic of the CUDA twin equals flashlab.traffic's closed forms, to the byte.

The instrumented build of each kernel (count_traffic=True) adds every byte a thread loads
from or stores to global memory into a counter; the closed forms
(flashlab.traffic.tiled_attention_traffic / standard_attention_traffic) are written from the
tiling alone, without the kernels' skip function (checked against it separately below).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import make_qkv

from flashlab.gpu import flash_attention_backward_gpu, flash_attention_gpu, standard_attention_gpu
from flashlab.gpu.standard import STANDARD_TILE
from flashlab.gpu.target import cuda as _select_target
from flashlab.masks import band_from, clamp_band, kv_block_range
from flashlab.traffic import Traffic, gpu_keys_visited, standard_attention_traffic, tiled_attention_traffic

cuda = _select_target()   # the planted kernel below names `cuda` as a module global (the simulator swaps it)

# (B, H, Hkv, Sq, Sk, Dqk, Dv, causal, block_q, block_k)
SHAPES = {
    "7x33 causal GQA": (1, 2, 1, 7, 33, 8, 8, True, 4, 8),
    "33x7 causal": (2, 1, 1, 33, 7, 8, 4, True, 8, 4),
    "20x20 non-causal 192/128": (1, 1, 1, 20, 20, 192, 128, False, 8, 8),
    "64x64 causal": (1, 1, 1, 64, 64, 4, 4, True, 16, 16),
}


def closed_form(shape, backward=False):
    B, H, Hkv, Sq, Sk, Dqk, Dv, causal, bq, bk = shape
    return tiled_attention_traffic(Sq, Sk, Dqk, Dv, block_q=bq, block_k=bk, batch=B, heads=H,
                                   causal=causal, backward=backward, kv_heads=Hkv)


def run_forward(shape, count=True):
    B, H, Hkv, Sq, Sk, Dqk, Dv, causal, bq, bk = shape
    x = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, seed=5)
    return x, flash_attention_gpu(**x, causal=causal, block_q=bq, block_k=bk, count_traffic=count)


@pytest.mark.parametrize("name", list(SHAPES))
def test_forward_count_equals_closed_form(name):
    x, (o, lse, traffic) = run_forward(SHAPES[name])
    assert isinstance(traffic, Traffic)
    assert traffic == closed_form(SHAPES[name])
    # the counting build computes the same numbers as the plain one
    _, (o2, lse2) = run_forward(SHAPES[name], count=False)
    np.testing.assert_array_equal(o, o2)
    np.testing.assert_array_equal(lse, lse2)


@pytest.mark.parametrize("name", ["7x33 causal GQA", "20x20 non-causal 192/128"])
def test_backward_count_equals_closed_form(name):
    B, H, Hkv, Sq, Sk, Dqk, Dv, causal, bq, bk = SHAPES[name]
    x, (o, lse, _) = run_forward(SHAPES[name])
    *_, traffic = flash_attention_backward_gpu(o, **x, o=o, lse=lse, causal=causal, block_q=bq,
                                               block_k=bk, count_traffic=True)
    assert traffic == closed_form(SHAPES[name], backward=True)


@pytest.mark.parametrize("causal", [False, True])
def test_standard_count_equals_closed_form(causal):
    B, H, Hkv, Sq, Sk, Dqk, Dv = 1, 2, 1, 37, 21, 8, 4
    x = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, seed=5)
    _, traffic = standard_attention_gpu(**x, causal=causal, count_traffic=True)
    assert traffic == standard_attention_traffic(
        Sq, Sk, Dqk, Dv, tile=STANDARD_TILE, batch=B, heads=H)


def test_causal_skip_reads_fewer_kv_bytes():
    shape = SHAPES["64x64 causal"]
    _, (*_, causal) = run_forward(shape)
    _, (*_, full) = run_forward(shape[:7] + (False,) + shape[8:])
    # 4 q-blocks of 16: causal visits 1+2+3+4 = 10 of the 16 kv tiles
    kv_tile = 16 * (4 + 4) * 4
    assert full.read - causal.read == 6 * kv_tile
    assert full.written == causal.written


def test_keys_visited_is_the_kernels_skip_rule():
    # the closed form's own causal rule against flashlab.masks.kv_block_range (what the kernels use)
    for sq, sk, bq, bk, causal in itertools.product((1, 5, 16, 33), (1, 7, 16, 40), (1, 4, 16),
                                                    (1, 3, 16), (False, True)):
        bq, bk = min(bq, sq), min(bk, sk)
        left, right = clamp_band(*band_from(causal), sq, sk)
        for i, i0 in enumerate(range(0, sq, bq)):
            kb0, kb1 = kv_block_range(i0, min(i0 + bq, sq), sk, bk, left, right)
            keys = min(sk, kb1 * bk) - kb0 * bk
            assert gpu_keys_visited(sq, sk, bq, bk, i, causal=causal) == keys


def test_closed_forms_reject_bad_sizes():
    with pytest.raises(ValueError, match="block_q"):
        tiled_attention_traffic(8, 8, 4, 4, block_q=0, block_k=4)
    with pytest.raises(ValueError, match="tile"):
        standard_attention_traffic(8, 8, 4, 4, tile=0)


def test_fused_traffic_falls_with_the_tile_as_theorem_2_says():
    # K and V are re-read once per q-block: doubling block_q halves that term (N = 4096, d = 64)
    n, d = 4096, 64
    reads = [tiled_attention_traffic(n, n, d, d, block_q=b, block_k=b).read for b in (32, 64, 128)]
    kv = [r - 4 * n * d for r in reads]
    assert kv[0] == 2 * kv[1] == 4 * kv[2]
    std = standard_attention_traffic(n, n, d, d, tile=32).total
    assert std > 5 * tiled_attention_traffic(n, n, d, d, block_q=128, block_k=128).total


@pytest.mark.parametrize("sq, sk, bq, bk", [(33, 7, 8, 4), (7, 33, 4, 8), (40, 40, 16, 8)])
def test_twin_visits_the_tiles_the_cpu_kernel_computes(sq, sk, bq, bk):
    # the kernels' skip table is the CPU forward's tile skipping, q-block by q-block
    from flashlab import tiles_computed
    from flashlab.gpu.attention import kv_blocks
    from flashlab.validation import prepare
    x = make_qkv(1, 1, 1, sq, sk, 4, 4, seed=5)
    for causal in (False, True):
        ranges = kv_blocks(prepare(**x, causal=causal, block_q=bq, block_k=bk))
        cpu = tiles_computed(**x, causal=causal, block_q=bq, block_k=bk)[0, 0]
        np.testing.assert_array_equal(ranges[:, 1] - ranges[:, 0], cpu)


# ---------------------------------------------------------------------------------------------
# An independent count: every element any thread loads or stores, from the simulator's arrays
# ---------------------------------------------------------------------------------------------

def simulator_only():
    from flashlab.gpu.target import is_simulator
    if not is_simulator():
        pytest.skip("record_requests instruments Numba's CUDA simulator (a GPU is present)")


def gpu_dataflow(shape, dataflow, backward=False):
    """traffic.traffic's "gpu:*" dataflow for a SHAPES entry, as (read, write) ints."""
    from flashlab.traffic import backward_traffic, traffic
    B, H, Hkv, Sq, Sk, Dqk, Dv, causal, bq, bk = shape
    fn = backward_traffic if backward else traffic
    extra = dict(kv_heads=Hkv) if backward else {}
    t = fn(dataflow, seq_q=Sq, seq_k=Sk, d_qk=Dqk, d_v=Dv, batch=B, heads=H, elem=4, block_q=bq,
           block_k=bk, causal=causal, **extra)
    return int(t.read), int(t.written)


@pytest.mark.parametrize("name", ["7x33 causal GQA", "33x7 causal", "20x20 non-causal 192/128"])
def test_every_request_counted_equals_the_kernels_count_and_the_closed_form(name):
    from flashlab.gpu.traffic import record_requests
    simulator_only()
    shape = SHAPES[name]
    B, H, Hkv, Sq, Sk, Dqk, Dv, causal, bq, bk = shape
    x = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, seed=5)
    with record_requests() as log:
        o, lse, own = flash_attention_gpu(**x, causal=causal, block_q=bq, block_k=bk, count_traffic=True)
    assert log.launches == ["flash_forward_gpu"]
    assert (own.read, own.written) == gpu_dataflow(shape, "gpu:fused")
    assert log.traffic() == own
    # per argument: O and the LSE stored once each, nothing loaded from them
    args = log.by_argument()
    assert args["o"] == Traffic(0, 4 * B * H * Sq * Dv) and args["lse"] == Traffic(0, 4 * B * H * Sq)
    # and the same for the backward (FlashAttention-2's: D first, then key blocks outer), whose
    # atomics are on dQ only: dK and dV are stored once per element, never added into
    with record_requests() as log:
        *_, own_b = flash_attention_backward_gpu(o, **x, o=o, lse=lse, causal=causal, block_q=bq,
                                                 block_k=bk, count_traffic=True)
    assert log.launches == ["backward_dot_gpu", "flash_backward_gpu"]
    assert (own_b.read, own_b.written) == gpu_dataflow(shape, "gpu:fused", backward=True)
    assert log.traffic() == own_b
    arrays = {(a.kernel, a.name): a for a in log.arrays}
    dq, dk, dv = (arrays["flash_backward_gpu", n] for n in ("dq", "dk", "dv"))
    assert dq.loads == dq.stores == 0 and dq.atomics > 0
    for grad, d in ((dk, Dqk), (dv, Dv)):
        assert grad.loads == grad.atomics == 0 and grad.stores == B * Hkv * Sk * d
        assert grad.stored.all()


@pytest.mark.parametrize("causal", [False, True])
def test_every_request_of_the_standard_kernels(causal):
    from flashlab.gpu.traffic import record_requests
    from flashlab.traffic import traffic
    simulator_only()
    B, H, Hkv, Sq, Sk, Dqk, Dv = 1, 2, 1, 37, 21, 8, 4
    x = make_qkv(B, H, Hkv, Sq, Sk, Dqk, Dv, seed=5)
    with record_requests() as log:
        _, own = standard_attention_gpu(**x, causal=causal, count_traffic=True)
    assert len(log.launches) == 3
    want = traffic("gpu:standard", seq_q=Sq, seq_k=Sk, d_qk=Dqk, d_v=Dv, batch=B, heads=H, elem=4,
                   block_q=STANDARD_TILE)
    assert log.traffic() == own == Traffic(int(want.read), int(want.written))
    # S and P go through global memory: every element of the (B, H, Sq, Sk) matrix is written
    # (S, then P) and read back (the softmax reads S, PV reads P) by the three launches
    n = B * H * Sq * Sk
    scores = [a for a in log.arrays if a.loaded.shape == (B, H, Sq, Sk)]
    assert sum(a.stores for a in scores) >= 2 * n and sum(a.loads for a in scores) >= 2 * n
    assert all(a.loaded.all() or a.stored.all() for a in scores)


def test_distinct_bytes_are_the_compulsory_traffic():
    # an ideal cache fetches each element once: Q, K, V read once, O, LSE written once, which is
    # traffic.traffic("fused", kv_hit=1), the DRAM bytes of the L2 note
    from flashlab.gpu.traffic import record_requests
    from flashlab.tiling import KV_RESIDENT
    from flashlab.traffic import traffic
    simulator_only()
    B, H, Sq, Sk, D = 1, 2, 24, 20, 8
    x = make_qkv(B, H, H, Sq, Sk, D, D, seed=5)
    for causal in (False, True):
        with record_requests() as log:
            *_, own = flash_attention_gpu(**x, causal=causal, block_q=8, block_k=4, count_traffic=True)
        dram = traffic("fused", seq_q=Sq, seq_k=Sk, d_qk=D, d_v=D, batch=B, heads=H, elem=4,
                       lse_elem=4, kv_hit=KV_RESIDENT, causal=causal)
        assert log.distinct_traffic() == Traffic(int(dram.read), int(dram.written))
        assert own.read > dram.read                    # the re-reads L2 may serve


def planted_forward(block: int, d: int, planted: bool):
    """A small fused forward (one thread per query row, K and V tiles staged in shared memory,
    online softmax) with its own counter; ``planted`` reads K from global memory in the score
    loop instead of from the staged tile, and does not count it, exactly the bug a kernel's own
    counter cannot see."""
    import math

    from numba import float32

    B_, D_, PLANTED = block, d, planted

    @cuda.jit
    def planted_forward_gpu(q, k, v, o, lse, counter):
        S = q.shape[0]
        i = cuda.blockIdx.x * B_ + cuda.threadIdx.x
        t = cuda.threadIdx.x
        ks = cuda.shared.array((B_, D_), float32)
        vs = cuda.shared.array((B_, D_), float32)
        acc = cuda.local.array(D_, float32)
        qrow = cuda.local.array(D_, float32)
        for e in range(D_):
            qrow[e] = q[i, e]
        reads = 4 * D_
        m = float32(-math.inf)
        l = float32(0.0)
        for e in range(D_):
            acc[e] = float32(0.0)
        for j0 in range(0, S, B_):
            cuda.syncthreads()
            for e in range(t, B_ * D_, B_):       # stage K_j, V_j (counted)
                ks[e // D_, e % D_] = k[j0 + e // D_, e % D_]
                vs[e // D_, e % D_] = v[j0 + e // D_, e % D_]
                reads += 8
            cuda.syncthreads()
            for c in range(B_):
                x = float32(0.0)
                for e in range(D_):
                    # S_ic = Q_i . K_c, from the staged tile, or (planted) from global memory
                    x += qrow[e] * (k[j0 + c, e] if PLANTED else ks[c, e])
                m_new = max(m, x)
                alpha = math.exp(m - m_new)
                p = math.exp(x - m_new)
                l = alpha * l + p
                for e in range(D_):
                    acc[e] = alpha * acc[e] + p * vs[c, e]
                m = m_new
        for e in range(D_):
            o[i, e] = acc[e] / l
        lse[i] = m + math.log(l)
        cuda.atomic.add(counter, 0, reads)
        cuda.atomic.add(counter, 1, 4 * (D_ + 1))

    return planted_forward_gpu


@pytest.mark.parametrize("planted", [False, True])
def test_a_planted_read_of_k_in_the_inner_loop_is_caught(planted):
    from flashlab.gpu.traffic import record_requests
    from flashlab.traffic import traffic
    simulator_only()
    S, block, d = 8, 4, 4
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((S, d)).astype(np.float32) for _ in range(3))
    kernel = planted_forward(block, d, planted)
    o = cuda.device_array((S, d), np.float32)
    lse = cuda.device_array(S, np.float32)
    counter = cuda.to_device(np.zeros(2, np.int64))
    with record_requests() as log:
        kernel[S // block, block](cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), o, lse,
                                           counter)
    own = Traffic.from_counter(counter.copy_to_host())
    closed = traffic("gpu:fused", seq_q=S, d_qk=d, d_v=d, elem=4, block_q=block)
    # the kernel's own count equals the closed form, planted read or not: it cannot see the bug
    assert own == Traffic(int(closed.read), int(closed.written))
    s = q @ k.T
    p = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(o.copy_to_host(), p @ v / p.sum(axis=1, keepdims=True), rtol=1e-5)
    k_reads = log.by_argument()["k"].read
    staged = 4 * (S // block) * S * d                  # each query block stages all of K once
    if planted:
        # every thread reads all of K in its score loop: S rows x S keys x d, on top of staging
        assert k_reads == staged + 4 * S * S * d
        assert log.traffic() != own
    else:
        assert k_reads == staged
        assert log.traffic() == own


@pytest.mark.parametrize("sq, sk, bq, bk", [(33, 7, 8, 4), (7, 33, 4, 8), (40, 40, 16, 8), (5, 64, 8, 16)])
def test_backward_visits_the_forwards_tiles_key_block_by_key_block(sq, sk, bq, bk):
    # q_blocks (the backward's table, key blocks outer) is kv_blocks transposed: the same tiles
    from flashlab.gpu.attention import kv_blocks, q_blocks
    from flashlab.validation import prepare
    x = make_qkv(1, 1, 1, sq, sk, 4, 4, seed=5)
    for causal in (False, True):
        p = prepare(**x, causal=causal, block_q=bq, block_k=bk)
        forward = {(i, j) for i, (a, b) in enumerate(kv_blocks(p)) for j in range(a, b)}
        backward = {(i, j) for j, (a, b) in enumerate(q_blocks(p)) for i in range(a, b)}
        assert backward == forward and q_blocks(p).shape == (-(-sk // min(bk, sk)), 2)
