"""flashlab.viz.rope: the buffer lists of the three score-tile options and the two drawings."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from flashlab.rope import pair_indices  # noqa: E402
from flashlab.viz.rope import BUFFER_KINDS, TILE_OPTIONS, draw_rope_pairs, draw_score_options, tile_buffers  # noqa: E402


def elements(option: str, kind: str, **sizes) -> int:
    return sum(r * c for _, (r, c), k in tile_buffers(option, **sizes) if k == kind)


@pytest.mark.parametrize("sizes", [{}, dict(block_q=64, block_k=48, d_nope=16, d_rope=8)])
def test_score_buffers_one_two_one(sizes):
    """concat and in place need one score tile, the naive split two; only concat copies."""
    bq, bk = sizes.get("block_q", 128), sizes.get("block_k", 128)
    dn, dr = sizes.get("d_nope", 128), sizes.get("d_rope", 64)
    assert elements("concat", "score", **sizes) == bq * bk
    assert elements("two buffers", "score", **sizes) == 2 * bq * bk
    assert elements("in place", "score", **sizes) == bq * bk
    # the concat's copies are the 192-wide Q and K tiles; the split options read the parts as they are
    assert elements("concat", "copy", **sizes) == (bq + bk) * (dn + dr)
    for option in ("two buffers", "in place"):
        assert elements(option, "copy", **sizes) == 0
        assert elements(option, "operand", **sizes) == (bq + bk) * (dn + dr)
    for option in TILE_OPTIONS:
        assert {k for _, _, k in tile_buffers(option, **sizes)} <= set(BUFFER_KINDS)


@pytest.mark.parametrize("kw, error, match", [
    (dict(option="fused"), ValueError, "option must be one of"),
    (dict(option="in place", block_q=0), ValueError, "block_q must be >= 1"),
    (dict(option="in place", d_rope=2.0), TypeError, "d_rope must be an int"),
    (dict(option="concat", block_k=True), TypeError, "block_k must be an int"),
])
def test_tile_buffers_rejects_bad_arguments(kw, error, match):
    option = kw.pop("option")
    with pytest.raises(error, match=match):
        tile_buffers(option, **kw)


def test_draw_score_options_draws_each_options_buffers():
    fig = draw_score_options(block_q=64, block_k=32, d_nope=16, d_rope=8)
    assert [ax.get_title() for ax in fig.axes] == list(TILE_OPTIONS)
    for ax, option in zip(fig.axes, TILE_OPTIONS):
        gids = [p.get_gid() for p in ax.patches if p.get_gid() in BUFFER_KINDS]
        assert gids.count("score") == {"concat": 1, "two buffers": 2, "in place": 1}[option]
        assert gids.count("copy") == (2 if option == "concat" else 0)
        assert gids.count("operand") == (0 if option == "concat" else 4)
    # footers: 2 x 64x32 float32 = 16 KiB for the naive split
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert any("2 x 64x32 = 16 KiB" in t for t in texts)
    fig.canvas.draw()          # every label must parse as mathtext
    plt.close(fig)


@pytest.mark.parametrize("dim", [2, 8, 14])
def test_draw_rope_pairs_joins_the_codes_pairs(dim):
    fig = draw_rope_pairs(dim)
    ax = fig.axes[0]
    arcs = [p for p in ax.patches if (p.get_gid() or "").startswith("pair ")]
    assert len(arcs) == dim          # dim / 2 pairs in each of the two layouts
    # rotate-half's arcs come first: their ends are pair_indices' features (box centres at f + 0.45)
    for interleaved, group in ((False, arcs[:dim // 2]), (True, arcs[dim // 2:])):
        a, b = pair_indices(dim, interleaved)
        for i, arc in enumerate(group):
            (x0, _), (x1, _) = arc._posA_posB
            assert (round(x0 - 0.45), round(x1 - 0.45)) == (a[i], b[i])
    fig.canvas.draw()
    plt.close(fig)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (3, ValueError), (34, ValueError),
                                        (8.0, TypeError), (True, TypeError)])
def test_draw_rope_pairs_rejects_bad_dim(bad, error):
    with pytest.raises(error, match="dim must be an even int"):
        draw_rope_pairs(bad)
