"""flashlab.vendor: one row per vendor figure, four estimates, a verdict computed from them."""
import json
import re
from pathlib import Path

import pytest

from flashlab import vendor
from flashlab.vendor import Estimate, VendorRow

ROOT = Path(__file__).resolve().parent.parent


def test_every_row_has_four_estimates_a_source_and_a_verdict():
    bib = (ROOT / "book" / "references.bib").read_text()
    keys = set(re.findall(r"@\w+\{([^,]+),", bib))
    rows = vendor.vendor_table()
    assert len({r.key for r in rows}) == len(rows)
    for r in rows:
        assert set(r.estimates) == set(vendor.ESTIMATES)
        assert r.source in keys
        assert r.verdict and r.verdict == vendor.verdict(r)
        assert any(e.known for e in r.estimates.values())


def test_the_figures_are_the_seeds():
    rows = {r.key: r for r in vendor.vendor_table()}
    assert rows["fa_forward"].vendor == 1.30 and rows["fa_backward"].vendor == 1.20
    assert rows["concat_share"].vendor == pytest.approx(0.135, abs=5e-4)
    assert rows["inplace"].vendor == 1.205 and rows["ping_pong"].vendor == 0.08
    assert rows["end_to_end"].vendor == 0.048 and rows["memory"].vendor == 4e9


def test_known_estimates():
    rows = {r.key: r for r in vendor.vendor_table()}
    # FLOP ratios: forward (2*192 + 2*192) / (2*192 + 2*128), backward 5*192 / (3*192 + 2*128)
    assert rows["fa_forward"].estimates["cost"].low == pytest.approx(1.2)
    assert rows["fa_backward"].estimates["cost"].low == pytest.approx(960 / 832)
    # the split RoPE product does the concatenated product's FLOPs
    assert rows["inplace"].estimates["cost"].low == pytest.approx(1.0)
    # native V saves V padded (192), O_att (192 + its LSE is in both) and the sliced O (128) minus O (128)
    assert rows["memory"].estimates["cost"].low == 128 * 4096 * 384 * 2
    assert not rows["ping_pong"].estimates["cpu"].known


def test_cpu_estimates_follow_the_committed_run(tmp_path):
    run = json.loads((vendor.DATA_DIR / "bench_mla.json").read_text())
    for r in run["cases"]:
        if r["impl"] == "mla:baseline" and r["direction"] == "forward":
            r["seconds"] *= 2
    path = tmp_path / "bench_mla.json"
    path.write_text(json.dumps(run))
    before = vendor.row("fa_forward").estimates["cpu"].low
    after = vendor.row("fa_forward", mla_bench_json=str(path)).estimates["cpu"].low
    assert after == pytest.approx(2 * before)


def _row(kind, v, **est):
    full = {k: est.get(k, Estimate(None, None, "—")) for k in vendor.ESTIMATES}
    return VendorRow("x", "x", v, kind, "k", "", "", full)


@pytest.mark.parametrize("estimates, expected", [
    # like-for-like ranges only: an estimate of another quantity never decides
    ({"roofline": Estimate(1.2, 1.4, "", like=True)}, "reproduced: 910B roofline 1.2×–1.4× contains 1.3×"),
    ({"roofline": Estimate(1.2, 1.25, "", like=True)}, "partly reproduced: 910B roofline 1.2×–1.25× misses "
                                                         "1.3× by 17% of its effect"),
    ({"roofline": Estimate(1.0, 1.1, "", like=True)}, "not reproduced: 910B roofline 1×–1.1× misses 1.3× by "
                                                        "67% of its effect"),
    ({"cost": Estimate(1.3, 1.3, "")}, "not comparable: no estimate measures the figure's quantity"),
    ({}, "not comparable: no estimate measures the figure's quantity"),
])
def test_verdict_of_a_speedup(estimates, expected):
    assert vendor.verdict(_row("speedup", 1.30, **estimates)) == expected


def test_verdict_joins_like_ranges_and_states_the_reason_when_not_comparable():
    v = vendor.verdict(_row("cut", 0.08, cost=Estimate(0.08, 0.08, "8%"),
                            pipeline=Estimate(0.2, 0.3, "", like=True), roofline=Estimate(0.1, 0.12, "", like=True)))
    assert v == "partly reproduced: 910B roofline, pipeline model 10.0%–30.0% misses 8.0% by 25% of its effect"
    row = VendorRow("x", "x", 0.048, "step gain", "k", "", "", {}, not_comparable="a whole step")
    assert vendor.verdict(row) == "not comparable: a whole step"
    at_least = VendorRow("x", "x", 5.0, "speedup", "k", "", "", {"roofline": Estimate(2, 6, "", like=True)},
                         at_least=True)
    assert vendor.verdict(at_least).startswith("reproduced")


def test_verdicts_are_strict_pairs():
    pairs = vendor.verdicts()
    assert len(pairs) == len(vendor.vendor_table())
    assert all(v in vendor.VERDICTS for _, v in pairs)
    assert not any("consistent" in r.verdict for r in vendor.vendor_table())
    by_key = {r.key: vendor.verdict_headline(r.verdict) for r in vendor.vendor_table()}
    # a step, a module share and a device's memory are not the attention forward: never matched
    for key in ("llama_step", "end_to_end", "memory", "concat_share"):
        assert by_key[key] == "not comparable"


def test_seed_figures_state_their_own_inconsistencies():
    rows = {r.key: r for r in vendor.vendor_table()}
    own = " ".join(rows["llama_step"].inconsistencies)
    assert "63,015 tokens/s" in own and "not the 1,200" in own      # 8 x 4096 / 0.52 s
    assert "26 GB" in own and "6.1 GB" in own
    md = vendor.table_markdown(["llama_step"])
    assert "The figure's own arithmetic" in md


def test_amdahl_share():
    # 1 / 1.048 = 1 - f (1 - 1 / s)
    f = vendor.amdahl_share(0.048, 1.2)
    assert 1 / 1.048 == pytest.approx(1 - f * (1 - 1 / 1.2))
    assert vendor.amdahl_share(0.048, 1.0) == float("inf")


def test_table_markdown_and_row_lookup():
    md = vendor.table_markdown(["concat_share", "inplace"])
    assert md.count("\n|") == 3 and "13.5%" in md and "[ascend2025rectfa]" in md and "{cite}" not in md
    with pytest.raises(KeyError, match="fa_forward"):
        vendor.row("nope")


def test_table_fits_a_page_column():
    # seven columns beside the book's two sidebars: a cell may wrap, but no word may force a
    # column wide (an explanation in a cell did: "software-managed"), so the table never
    # scrolls sideways; what a short cell leaves out is in the notes below it
    md = vendor.table_markdown()
    body = [ln for ln in md.splitlines() if ln.startswith("|")][2:]
    assert len(body) == len(vendor.vendor_table())
    for ln in body:
        cells = [c.strip() for c in ln.strip("| ").split(" | ")]
        assert len(cells) == 7
        words = [w for c in cells[1:] for w in c.split()]
        assert max(map(len, words)) <= 12, ln
        assert ":" not in cells[-1] and "(" not in "".join(c for c in cells[2:6] if c.startswith("—"))
    notes = [ln for ln in md.splitlines() if ln.startswith("- *")]
    assert len(notes) == len(body) and all("Verdict: " in n for n in notes)
    assert "Not modelled — pipeline model: the pipeline model has no unfused baseline" in md
    assert vendor.verdict_headline("partly reproduced: x 1–2 misses 3") == "partly reproduced"
    assert vendor.verdict_headline("reproduced") == "reproduced"


def test_sensitivity_moves_one_assumed_number():
    """The verdicts at the ends of the assumed HBM range; a verdict that is the same at both
    ends holds over it. The ping-pong verdict moves with the assumed Vector rate."""
    rows = vendor.sensitivity("hbm_bandwidth")
    beta = vendor.ASCEND_910B.hbm_bandwidth
    assert all(set(v) == {beta.low, beta.value, beta.high} for _, v in rows)
    assert all(w in vendor.VERDICTS for _, v in rows for w in v.values())
    base = {f: v[beta.value] for f, v in rows}
    assert base == dict(vendor.verdicts())
    with pytest.raises(ValueError, match="parameter must be one of"):
        vendor.sensitivity("clock")


#: the rect_fa chapter's verdict bullets (their bold heads) and the vendor rows they speak for
RECT_FA_BULLETS = {"Native V, forward": "fa_forward", "Native V, backward": "fa_backward",
                   "Concat's share": "concat_share", "In-place accumulation": "inplace",
                   "Ping-pong": "ping_pong", "End to end": "end_to_end", "Memory": "memory"}


def test_rect_fa_states_the_verdicts_the_table_computes():
    """Each of the rect_fa chapter's bullets on the vendor table names, in its bold head, the
    strict verdict flashlab.vendor computes for its row; no prose calls a verdict 'consistent'."""
    cells = json.loads((ROOT / "book" / "rect_fa.ipynb").read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for head, key in RECT_FA_BULLETS.items():
        word = vendor.verdict_headline(vendor.row(key).verdict)
        m = re.search(rf"^- \*\*{re.escape(head)}: ([a-z ]+?)[.,][^*]*\*\*", text, flags=re.M)
        assert m, f"rect_fa: no bullet '- **{head}: <verdict>.**'"
        assert m.group(1) == word, f"rect_fa says {head}: {m.group(1)!r}; flashlab.vendor computes {word!r}"
    for page in (ROOT / "book").glob("*.ipynb"):
        for c in json.loads(page.read_text())["cells"]:
            if c["cell_type"] == "markdown":
                assert not re.search(r"verdict\w*[^.]{0,80}\bconsistent\b|\bconsistent\b[^.]{0,40}verdict",
                                     "".join(c["source"]), flags=re.I), page.name
