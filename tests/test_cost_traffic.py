"""traffic.traffic: the one traffic model. Chapter 1's fused-kernel numbers and the MLA ledger are
the same function at two values of the K/V hit rate, and agree for the same problem."""
from __future__ import annotations

import pytest

from flashlab import flops, ledgers, tiling, traffic
from flashlab.dataflows import StepName, total

MiB = 2 ** 20


def test_fused_at_zero_hit_is_the_tiled_count():
    for sq, sk, d, dv, bq in ((4096, 4096, 128, 128, 128), (1000, 777, 64, 48, 96), (5, 9, 8, 4, 2)):
        t = traffic.traffic("fused", seq_q=sq, seq_k=sk, d_qk=d, d_v=dv, block_q=bq, kv_hit=0.0, lse_elem=2)
        assert t.total == 2 * traffic.hbm_elements_flash(sq, sk, d, dv, bq)


def test_chapter_one_numbers():
    """66 MiB per head at 128/128 and 82.5 MiB at 192/128 (N = 4096, q-blocks of 128, fp16, every
    re-read a miss); K/V resident: 4 MiB read plus 1 MiB written at 192/128."""
    def fused(d, dv, hit):
        return traffic.traffic("fused", seq_q=4096, d_qk=d, d_v=dv, block_q=128, kv_hit=hit, lse_elem=0)
    assert fused(128, 128, 0.0).total == 66 * MiB
    assert fused(192, 128, 0.0).total == 82.5 * MiB
    resident = fused(192, 128, tiling.KV_RESIDENT)
    assert (resident.read, resident.written) == (4 * MiB, 1 * MiB)


@pytest.mark.parametrize("hit", [0.0, 0.25, 0.9, 1.0])
@pytest.mark.parametrize("causal", [False, True])
def test_mla_ledger_kernel_is_the_fused_kernel(hit, causal):
    """The MLA ledger's kernel step (native V: the kernel at D = 192, Dv = 128) moves exactly the
    bytes of the fused kernel of chapter 1 for the same problem, at every hit rate."""
    B, H, S = 2, 4, 1000
    steps = ledgers.mla_forward_steps(B, H, S, 128, 64, 128, dataflow="native_v", causal=causal, elem=2,
                                   kv_hit=hit, block_q=128)
    kernel = next(s for s in steps if s.name == StepName.ATTENTION)
    fused = traffic.traffic("fused", seq_q=S, d_qk=192, d_v=128, batch=B, heads=H, block_q=128, kv_hit=hit,
                         causal=causal)
    assert kernel.bytes_read == pytest.approx(fused.read, abs=1)
    assert kernel.bytes_written == fused.written


def test_mla_dataflows_through_traffic_match_the_ledger():
    for flow in ("baseline", "native_v", "split_rope", "rect"):
        t = traffic.traffic(f"mla:{flow}", seq_q=512, d_nope=128, d_rope=64, d_v=128, heads=8, causal=True,
                         kv_hit=tiling.KV_RESIDENT)
        ledger = total(ledgers.mla_forward_steps(1, 8, 512, 128, 64, 128, dataflow=flow, causal=True))
        assert (t.read, t.written) == (ledger.bytes_read, ledger.bytes_written)
    # the default of the ledger is K/V resident; a miss adds exactly (f - 1) passes over K and V
    res = traffic.traffic("mla:rect", seq_q=512, d_nope=128, d_rope=64, d_v=128, heads=8, kv_hit=1.0)
    miss = traffic.traffic("mla:rect", seq_q=512, d_nope=128, d_rope=64, d_v=128, heads=8, kv_hit=0.0)
    assert miss.read - res.read == pytest.approx((512 // 128 - 1) * 2 * 8 * 512 * (192 + 128))


def test_hit_rate_monotone_and_decode_and_standard():
    ts = [traffic.traffic("fused", seq_q=4096, d_qk=128, d_v=128, kv_hit=h).total for h in (0, .3, .6, 1)]
    assert ts == sorted(ts, reverse=True) and ts[0] > 10 * ts[-1]
    dec = {h: traffic.traffic("decode", seq_q=1, seq_k=8192, d_qk=128, d_v=128, kv_hit=h).total for h in (0, 1)}
    assert dec[0] == dec[1] == 2 * (128 + 8192 * 256 + 128) + 4
    std = traffic.traffic("standard", seq_q=300, seq_k=200, d_qk=64, d_v=32, elem=4, heads=3)
    assert std.total == 3 * 4 * traffic.hbm_elements_standard(300, 200, 64, 32)


@pytest.mark.parametrize("kw, err, match", [
    (dict(dataflow="flash"), ValueError, "dataflow must be one of"),
    (dict(dataflow="fused", kv_hit=1.5), ValueError, "kv_hit must be a number in"),
    (dict(dataflow="fused", kv_hit=True), ValueError, "kv_hit"),
    (dict(dataflow="mla:rect"), ValueError, "needs d_nope"),
    (dict(dataflow="fused", block_q=0), ValueError, "block_q must be >= 1"),
])
def test_traffic_validates(kw, err, match):
    args = dict(seq_q=64, d_qk=16, d_v=16)
    with pytest.raises(err, match=match):
        traffic.traffic(**{**args, **kw})


def test_causal_reads_only_the_visited_tiles():
    """Causal: q-block [i0, i1) reads keys [0, i1): about half the re-reads of the full square."""
    assert tiling.kv_reread_factor(4096, 128, 0.0, causal=True) == 16.5
    assert tiling.kv_reread_factor(4096, 128, 1.0, causal=True) == 1.0
    # Sq > Sk: the rows past the last key read all Sk keys
    assert tiling.kv_reread_factor(10, 4, 0.0, seq_k=6, causal=True) == (4 + 6 + 6) / 6


def test_910b_roofline_position_by_hit_rate():
    """The RECT-FA forward kernel (DeepSeek-V3 layer, S = 4096, causal, bf16) on the 910B roofline:
    memory-bound when every K/V re-read misses (chapter 1's count), compute-bound with K/V
    resident (the ledger's count); it crosses the ridge in between."""
    from flashlab import rect
    from flashlab.pipeline.profiles import ASCEND_910B
    pts = rect.kernel_roofline_by_hit(ASCEND_910B, hits=(0.0, 1.0))
    assert [p.bound for p in pts] == ["memory", "compute"]
    h = rect.break_even_hit(ASCEND_910B)
    assert 0.0 < h < 1.0
    at = rect.kernel_roofline_by_hit(ASCEND_910B, hits=(h,))[0]
    assert at.intensity == pytest.approx(at.ridge, rel=1e-6)


def test_backward_traffic_is_the_forward_model_with_the_accumulators_streamed_too():
    """The backward's bytes come from the same K/V re-read factor as the forward's, and
    flash_backward_intensity is FLOPs over them (no second formula)."""
    sq, sk, d, dv, bq = 1000, 700, 192, 128, 128
    for hit in (0.0, 0.4, tiling.KV_RESIDENT):
        for causal in (False, True):
            f = tiling.kv_reread_factor(sq, bq, hit, seq_k=sk, causal=causal)
            t = traffic.backward_traffic(seq_q=sq, seq_k=sk, d_qk=d, d_v=dv, elem=2, block_q=bq, kv_hit=hit,
                                      causal=causal, heads=3)
            fwd = traffic.traffic("fused", seq_q=sq, seq_k=sk, d_qk=d, d_v=dv, elem=2, block_q=bq, kv_hit=hit,
                               causal=causal, heads=3)
            # read Q, O, dO, LSE once, K, V, dK, dV f times; write dQ once, dK, dV f times
            assert t.read == pytest.approx(3 * (2 * (sq * (d + 2 * dv) + 2 * f * sk * (d + dv)) + 4 * sq))
            assert t.written == pytest.approx(3 * 2 * (sq * d + f * sk * (d + dv)))
            # the forward's K/V stream is one of the backward's three
            assert fwd.read - 3 * 2 * sq * d == pytest.approx(3 * 2 * f * sk * (d + dv))
    # resident K/V: reads Q, O, dO, K, V and the dK, dV accumulators once (7 arrays), writes dQ, dK, dV
    res = traffic.backward_traffic(seq_q=512, d_qk=64, d_v=64, elem=4, kv_hit=1.0, lse_elem=0)
    assert (res.read, res.written) == (4 * 512 * 64 * 7, 4 * 512 * 64 * 3)
    assert flops.flash_backward_intensity(512, 512, 64, 64, block_q=128, kv_hit=1.0) == pytest.approx(
        flops.attention_backward_flops(512, 512, 64, 64)
        / traffic.backward_traffic(seq_q=512, d_qk=64, d_v=64, elem=4, kv_hit=1.0).total)
    with pytest.raises(ValueError, match="dataflow must be one of"):
        traffic.backward_traffic("standard", seq_q=8, d_qk=8, d_v=8)
    with pytest.raises(ValueError, match="kv_hit"):
        traffic.backward_traffic(seq_q=8, d_qk=8, d_v=8, kv_hit=1.5)


def test_standard_attention_has_one_count_per_named_dataflow():
    """Algorithm 0 ("standard") and the CUDA twin's three kernels ("gpu:standard") are two
    dataflows, each with its own count; the twin's fused kernels are "gpu:fused"."""
    n, d = 4096, 64
    kw = dict(seq_q=n, d_qk=d, d_v=d, elem=4)
    alg0 = traffic.traffic("standard", **kw)
    gpu = traffic.traffic("gpu:standard", **kw, block_q=32)
    # Algorithm 0: Q, K, V once, S written, read, P written, read: 4 N^2 + 4 N d elements
    assert alg0.total == 4 * (4 * n * n + 4 * n * d) == 260 * 2**20
    # the twin: K and V once per 32-row tile, S read twice: 5 N^2 + 2 N d + 2 (N / 32) N d
    assert gpu.total == 4 * (5 * n * n + 2 * n * d + 2 * (n // 32) * n * d) == 578 * 2**20
    assert gpu == traffic.standard_attention_traffic(n, n, d, d, tile=32)
    # the causal mask: free inside the twin's scores kernel, one more pass over S unfused
    assert traffic.traffic("gpu:standard", **kw, block_q=32, causal=True) == gpu
    assert traffic.traffic("standard", **kw, causal=True).total == alg0.total + 2 * 4 * n * n
    for causal in (False, True):
        fused = traffic.traffic("gpu:fused", seq_q=300, seq_k=200, d_qk=64, d_v=32, elem=4, heads=3,
                             block_q=64, block_k=16, causal=causal)
        assert fused == traffic.tiled_attention_traffic(
            300, 200, 64, 32, block_q=64, block_k=16, heads=3, causal=causal)
        back = traffic.backward_traffic("gpu:fused", seq_q=300, seq_k=200, d_qk=64, d_v=32, elem=4,
                                     heads=3, block_q=64, block_k=16, causal=causal)
        assert back == traffic.tiled_attention_traffic(
            300, 200, 64, 32, block_q=64, block_k=16, heads=3, causal=causal, backward=True)
    # block_k defaults to block_q; the no-mask fused twin is the "fused" model at kv_hit 0
    # (LSE in elem bytes)
    assert traffic.traffic("gpu:fused", **kw, block_q=64) == traffic.traffic("fused", **kw, block_q=64,
                                                                        lse_elem=4)


@pytest.mark.parametrize("dataflow", ["gpu:standard", "gpu:fused"])
def test_gpu_dataflows_count_requests_not_hits(dataflow):
    with pytest.raises(ValueError, match="kv_hit must be 0 for 'gpu:"):
        traffic.traffic(dataflow, seq_q=64, d_qk=16, d_v=16, kv_hit=0.5)
    with pytest.raises(ValueError, match="needs d_qk"):
        traffic.traffic(dataflow, seq_q=64, d_v=16)
    with pytest.raises(ValueError, match="block_q must be >= 1"):
        traffic.traffic(dataflow, seq_q=64, d_qk=16, d_v=16, block_q=0)
