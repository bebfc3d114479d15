"""flashlab.viz.masks: the gallery's panels count the tiles classify_tiles counts, and the varlen
launches count the tiles the kernel really computes (flashlab.tiles_computed)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import flashlab  # noqa: E402
from flashlab.cann import compressed_mask  # noqa: E402
from flashlab.masks import EMPTY, band_from, classify_tiles  # noqa: E402
from flashlab.viz import masks as vm  # noqa: E402

CAUSAL3 = dict(sparse_mode=3, atten_mask=compressed_mask(3))


def _docs(n: int) -> np.ndarray:
    m = np.ones((n, n), dtype=bool)
    m[: n // 3, : n // 3] = False
    m[n // 3:, n // 3:] = False
    return m


@pytest.mark.parametrize("sq, sk, options", [
    (20, 20, dict(causal=True)),
    (20, 29, dict(window=(5, -2))),
    (17, 23, dict(causal=True, window=(6, None))),
    (21, 21, dict(mask=_docs(21))),
])
def test_draw_case_returns_the_classes_and_counts_them(sq, sk, options):
    fig, ax = plt.subplots()
    classes = vm.draw_case(ax, sq, sk, 4, 6, title="t", **options)
    left, right = band_from(options.get("causal", False), options.get("window"))
    expected = classify_tiles(sq, sk, 4, 6, left, right, options.get("mask"))
    np.testing.assert_array_equal(classes, expected)
    assert f"{int(np.sum(expected == EMPTY))} empty" in ax.get_title()
    plt.close(fig)


def test_draw_case_rejects_a_mask_of_the_wrong_shape():
    fig, ax = plt.subplots()
    with pytest.raises(ValueError, match="mask must have shape"):
        vm.draw_case(ax, 8, 8, 4, 4, mask=np.zeros((8, 9), dtype=bool))
    plt.close(fig)


def test_mask_gallery_has_one_visible_panel_per_case():
    cases = {"causal": (16, 16, dict(causal=True)), "window": (16, 16, dict(window=(3, 3))),
             "docs": (21, 21, dict(mask=_docs(21))), "none": (8, 12, dict())}
    fig = vm.mask_gallery(cases, 4, 4, ncols=3)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title().split("\n")[0] for ax in visible] == list(cases)
    assert len(fig.axes) == 6
    plt.close(fig)
    with pytest.raises(ValueError, match="cases"):
        vm.mask_gallery({}, 4, 4)


def _tnd(lengths_q, lengths_k, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((sum(lengths_q), 1, d)).astype(np.float32),
            rng.standard_normal((sum(lengths_k), 1, d)).astype(np.float32),
            rng.standard_normal((sum(lengths_k), 1, d)).astype(np.float32))


@pytest.mark.parametrize("lengths_q, lengths_k, operator_mask", [
    ([13, 5, 22, 9], None, CAUSAL3),
    ([13, 5, 22, 9], None, dict()),
    ([6, 0, 11], [9, 4, 15], CAUSAL3),                     # an empty sequence, Sq < Sk
    ([7, 10], [7, 12], dict(sparse_mode=8, atten_mask=compressed_mask(8), pre_tokens=7,
                            next_tokens=1)),
])
def test_sequence_tiles_are_the_tiles_the_kernel_computes(lengths_q, lengths_k, operator_mask):
    """Per sequence: tiles_computed on the sequence's own slice, with the band the operator plans."""
    lk = lengths_q if lengths_k is None else lengths_k
    pieces = vm.sequence_tiles(lengths_q, lengths_k, block_q=4, block_k=3, **operator_mask)
    assert len(pieces) == sum(1 for x in lengths_q if x > 0)
    q, k, v = _tnd(lengths_q, lk)
    for p in pieces:
        # the allowed map of the piece is the operator's mask restricted to the sequence
        ok = vm.packed_allowed(lengths_q, lengths_k, **operator_mask)
        np.testing.assert_array_equal(p.ok, ok[p.q0:p.q1, p.k0:p.k1])
        tiles = flashlab.tiles_computed(q[p.q0:p.q1].transpose(1, 0, 2)[None],
                                        k[p.k0:p.k1].transpose(1, 0, 2)[None],
                                        v[p.k0:p.k1].transpose(1, 0, 2)[None],
                                        mask=~p.ok, block_q=4, block_k=3)
        assert int(tiles.sum()) == int(np.sum(p.classes != EMPTY))


def test_varlen_counts_match_the_kernel_and_the_padded_formula():
    lengths = [13, 5, 22, 9]
    counts = vm.varlen_counts(lengths, block_q=4, block_k=4, **CAUSAL3)
    # causal blocks of 13, 5, 22, 9 tokens on 4 x 4 tiles: n(n+1)/2 each
    assert counts.per_sequence == sum(n * (n + 1) // 2 for n in (4, 2, 6, 3))
    assert counts.padded == 4 * 6 * 6
    q, k, v = _tnd(lengths, lengths)
    ok = vm.packed_allowed(lengths, **CAUSAL3)
    packed = flashlab.tiles_computed(q.transpose(1, 0, 2)[None], k.transpose(1, 0, 2)[None],
                                     v.transpose(1, 0, 2)[None], mask=~ok, block_q=4, block_k=4)
    assert int(packed.sum()) == counts.packed
    # a short sequence pays a whole ragged tile on its own grid, and the packed grid may share
    # a tile between two sequences: per_sequence can exceed packed (here 40 > 38)
    assert counts.per_sequence == 40 and counts.packed == 38 and counts.padded == 144


def test_sequence_tiles_rejects_bad_lengths():
    with pytest.raises(ValueError, match="same number of sequences"):
        vm.sequence_tiles([3, 4], [3], block_q=2, block_k=2)
    with pytest.raises(ValueError, match="lengths_q"):
        vm.sequence_tiles([], block_q=2, block_k=2)
    with pytest.raises(ValueError, match="lengths_k"):
        vm.sequence_tiles([3], [-1], block_q=2, block_k=2)


def test_varlen_figure_titles_carry_the_counts():
    lengths = [9, 4, 14]
    counts = vm.varlen_counts(lengths, block_q=4, block_k=4, **CAUSAL3)
    fig = vm.varlen_figure(lengths, block_q=4, block_k=4, **CAUSAL3)
    titles = [ax.get_title() for ax in fig.axes]
    assert any(f": {counts.per_sequence} tiles" in t for t in titles)
    assert any(f": {counts.packed} tiles" in t for t in titles)
    assert any(f": {counts.padded} tiles" in t for t in titles)
    plt.close(fig)
