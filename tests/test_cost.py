"""flashlab.flops' and flashlab.traffic's closed forms against brute-force counts of the loops they describe."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from flashlab import flops, traffic

SIZES = [(1, 1, 1, 1), (7, 13, 5, 3), (64, 64, 64, 64), (129, 1000, 192, 128), (1000, 129, 72, 40)]


def count_standard(sq: int, sk: int, d: int, dv: int) -> int:
    """Algorithm 0 of the FlashAttention paper, step by step, counting every HBM element moved."""
    moved = 0
    moved += sq * d + sk * d     # 1. read Q, K
    moved += sq * sk             #    write S = Q K^T
    moved += sq * sk             # 2. read S
    moved += sq * sk             #    write P = softmax(S)
    moved += sq * sk + sk * dv   # 3. read P, V
    moved += sq * dv             #    write O = P V
    return moved


def count_flash(sq: int, sk: int, d: int, dv: int, block_q: int, block_k: int) -> int:
    """The tiled forward's loop nest (query-block outer), counting loads and stores per tile."""
    moved = 0
    for i0 in range(0, sq, block_q):
        rows = min(block_q, sq - i0)
        moved += rows * d                  # load Q_i once
        for j0 in range(0, sk, block_k):
            cols = min(block_k, sk - j0)
            moved += cols * d + cols * dv  # load K_j, V_j
        moved += rows * dv + rows          # store O_i and LSE_i
    return moved


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_hbm_standard_equals_step_count(sizes):
    assert traffic.hbm_elements_standard(*sizes) == count_standard(*sizes)


@pytest.mark.parametrize("block_k", [1, 16, 64, 5000])
@pytest.mark.parametrize("block_q", [1, 7, 64, 128, 5000])
@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_hbm_flash_equals_loop_count(sizes, block_q, block_k):
    """The formula counts every K/V block once per query block, whatever block_k is."""
    assert traffic.hbm_elements_flash(*sizes, block_q) == count_flash(*sizes, block_q, block_k)


def test_standard_moves_more_than_flash_at_large_sram():
    """With the block SRAM allows, standard attention moves more at every N >= 1024 and the ratio
    grows with N (standard is Theta(N^2), flash Theta(N^2 d^2 / M) with d^2/M small)."""
    d, M = 64, 100 * 1024 // 2   # 100 KiB of fp16
    blk = traffic.block_for_sram(M, d, d)
    ratios = []
    for n in [1024, 2048, 4096, 8192, 16384]:
        std, fl = traffic.hbm_elements_standard(n, n, d, d), traffic.hbm_elements_flash(n, n, d, d, blk)
        assert std > fl
        ratios.append(std / fl)
    assert ratios == sorted(ratios)


def test_flash_traffic_follows_theorem2():
    """HBM_flash / (N^2 d^2 / M) stays within a constant band as N grows (Theta, not just O),
    and more SRAM never means more traffic."""
    d, M = 64, 50_000
    blk = traffic.block_for_sram(M, d, d)
    ratios = [traffic.hbm_elements_flash(n, n, d, d, blk) / traffic.fa1_theorem2(n, d, M)
              for n in [4096, 8192, 16384, 32768]]
    assert max(ratios) / min(ratios) < 1.1
    elements = [traffic.hbm_elements_flash(8192, 8192, d, d, traffic.block_for_sram(m, d, d))
               for m in [10_000, 20_000, 50_000, 100_000, 200_000]]
    assert elements == sorted(elements, reverse=True)


@pytest.mark.parametrize("d_qk, d_v", [(64, 64), (192, 128), (72, 40), (1, 1)])
def test_block_for_sram_is_the_largest_that_fits(d_qk, d_v):
    """working set B^2 + B (2 Dqk + 2 Dv) fits for the returned B and not for B + 1."""
    def working_set(b):
        return b * b + b * (2 * d_qk + 2 * d_v)
    for m in [working_set(1), working_set(1) + 1, 1000, 12_345, 65_536, 256 * 1024, 10**7]:
        b = traffic.block_for_sram(m, d_qk, d_v)
        assert b >= 1 and working_set(b) <= m < working_set(b + 1), (m, b)
    # exactly at the boundary
    for b in [1, 2, 63, 64, 128]:
        assert traffic.block_for_sram(working_set(b), d_qk, d_v) == b
        if b > 1:
            assert traffic.block_for_sram(working_set(b) - 1, d_qk, d_v) == b - 1


def test_block_for_sram_too_small_raises():
    with pytest.raises(ValueError, match=r"sram_elems=10 cannot hold even a 1-row block"):
        traffic.block_for_sram(10, 64, 64)


def test_attention_flops_counts_the_two_matmuls():
    """2 m n k per matmul: Q K^T is (Sq x Dqk)(Dqk x Sk), P V is (Sq x Sk)(Sk x Dv)."""
    for sq, sk, dqk, dv, b, h in itertools.product([1, 7, 129], [3, 64], [72, 192], [40, 128], [1, 2], [1, 8]):
        want = b * h * (2 * sq * dqk * sk + 2 * sq * sk * dv)
        assert flops.attention_flops(sq, sk, dqk, dv, batch=b, heads=h) == want
    assert flops.attention_flops(100, 100, 64, 64, tile_fraction=0.5) == 0.5 * flops.attention_flops(100, 100, 64, 64)


def test_matmul_intensities_limits():
    """For N >> d, Q K^T approaches 2 d / elem FLOP/byte, softmax stays at 5 / (2 elem): memory bound."""
    d, elem = 64, 2
    small = flops.matmul_intensities(128, 128, d, d, elem)
    big = flops.matmul_intensities(1 << 20, 1 << 20, d, d, elem)
    assert small["QK^T"] < big["QK^T"] < 2 * d / elem
    assert big["QK^T"] == pytest.approx(2 * d / elem, rel=1e-3)
    assert big["PV"] == pytest.approx(2 * d / elem, rel=1e-3)
    assert small["softmax"] == big["softmax"] == flops.SOFTMAX_FLOPS_PER_ELEMENT / (2 * elem)


def test_standard_extra_bytes_is_one_score_matrix():
    s = np.empty((2, 3, 50, 70), dtype=np.float32)
    assert traffic.standard_attention_extra_bytes(50, 70, batch=2, heads=3, elem=4) == s.nbytes
