"""flashlab.vendor: one row per vendor figure, four estimates, a verdict computed from them."""
import json
import re
from pathlib import Path

import pytest

from flashlab import vendor
from flashlab.bench import PairedRatio, paired_ratio_of_rows
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


def test_cpu_estimates_follow_the_run(tmp_path):
    path = _noisy_mla_run(tmp_path, 0.01, 20)
    run = json.loads(Path(path).read_text())
    for r in run["cases"]:
        if r["impl"] == "mla:baseline" and r["direction"] == "forward":
            r["times"] = [2 * t for t in r["times"]]
    doubled = tmp_path / "bench_mla_doubled.json"
    doubled.write_text(json.dumps(run))
    before = vendor.row("fa_forward", mla_bench_json=path).estimates["cpu"].low
    after = vendor.row("fa_forward", mla_bench_json=str(doubled)).estimates["cpu"].low
    assert after == pytest.approx(2 * before)


def _row(kind, v, decides="pipeline", spread=(), flips=(), **est):
    full = {k: est.get(k, Estimate(None, None, "—")) for k in vendor.ESTIMATES}
    return VendorRow("x", "x", v, kind, "k", "", "", full, decides=decides, spread=spread, flips=flips)


@pytest.mark.parametrize("estimate, expected", [
    # +30 %: E = 0.30; reproduced within 0.075 of it, partly within a factor of two
    (1.30, "reproduced"), (1.23, "reproduced"), (1.37, "reproduced"),
    (1.22, "partly reproduced"), (1.16, "partly reproduced"), (1.60, "partly reproduced"),
    (1.14, "not reproduced"), (1.61, "not reproduced"), (0.90, "not reproduced"),
])
def test_classify_a_speedup(estimate, expected):
    assert vendor.classify("speedup", 1.30, estimate) == expected


def test_classify_a_lower_bound_and_a_cut():
    assert vendor.classify("speedup", 5.0, 9.0, at_least=True) == "reproduced"
    assert vendor.classify("speedup", 5.0, 4.0, at_least=True) == "reproduced"      # e = 3 >= 3/4 of 4
    assert vendor.classify("speedup", 5.0, 3.0, at_least=True) == "partly reproduced"
    assert vendor.classify("speedup", 5.0, 2.9, at_least=True) == "not reproduced"
    assert vendor.classify("cut", 0.08, 0.20) == "not reproduced"                   # over twice
    assert vendor.classify("cut", 0.08, -0.01) == "not reproduced"                  # wrong direction
    with pytest.raises(ValueError, match="positive effect"):
        vendor.classify("speedup", 0.9, 1.0)


def test_verdict_at_one_scenario_over_the_ranges():
    one = Estimate(1.28, 1.28, "1.28", like=True)
    # no ranges: the scenario alone
    assert vendor.verdict(_row("speedup", 1.30, pipeline=one)) == \
        "reproduced: calibrated model 1.28× against 1.3×"
    # the same word at every end of every range: that word, with the spread
    v = vendor.verdict(_row("speedup", 1.30, pipeline=one, spread=(("a", 1, 1.25), ("a", 3, 1.33))))
    assert v == "reproduced: calibrated model 1.28× against 1.3×, 1.25×–1.33× over the ranges"
    # another word at one end: undetermined, naming the parameter and where it flips
    v = vendor.verdict(_row("speedup", 1.30, pipeline=one, spread=(("a", 1, 1.20), ("a", 3, 1.33)),
                            flips=(("a", 1.5, "partly reproduced", "reproduced"),)))
    assert v.startswith("undetermined: calibrated model 1.28×") and \
        "a = 1.5 flips it (partly reproduced below, reproduced above)" in v
    # an estimate of another quantity never decides; the reason is stated when not comparable
    assert vendor.verdict(_row("speedup", 1.30, cost=Estimate(1.3, 1.3, ""))) == \
        "not comparable: no estimate measures the figure's quantity"
    row = VendorRow("x", "x", 0.048, "step gain", "k", "", "", {}, not_comparable="a whole step")
    assert vendor.verdict(row) == "not comparable: a whole step"


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
    assert "Not modelled — calibrated model: no backward pipeline model" in md
    assert vendor.verdict_headline("partly reproduced: x 1–2 misses 3") == "partly reproduced"
    assert vendor.verdict_headline("reproduced") == "reproduced"


def test_sensitivity_moves_one_parameter_to_the_ends_of_its_range():
    """The verdict words with one parameter moved; the table's verdict is one word where every
    end of every range agrees, else undetermined."""
    from flashlab.pipeline.calibrated import CHIPS
    p = CHIPS["910B2"].l2_core_rate
    rows = vendor.sensitivity("l2_core_rate")
    assert all(set(v) == {p.low, p.value, p.high} for _, v in rows)
    assert all(w in vendor.VERDICTS for _, v in rows for w in v.values())
    table = {r.figure: r for r in vendor.vendor_table()}
    for figure, words in rows:
        r = table[figure]
        assert words[p.value] == vendor.classify(r.kind, r.vendor, r.estimates[r.decides].low, at_least=r.at_least)
        if len(set(words.values())) > 1:
            assert vendor.verdict_headline(r.verdict) == "undetermined"
            assert any(name == "l2_core_rate" for name, *_ in r.flips)
    with pytest.raises(ValueError, match="parameter must be one of"):
        vendor.sensitivity("clock")
    md = vendor.sensitivity_markdown()
    assert md.count("\n|") == 1 + sum(1 for r in vendor.vendor_table() if r.spread)


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


def _noisy_mla_run(tmp_path, noise: float, rounds: int) -> str:
    """The committed MLA run with its times replaced by injected ones (native V 10 % faster than
    the baseline, rect 20 %, each call with log-normal noise ``noise``), its stored ratios dropped
    so that they are computed from the times; the path of the file."""
    import numpy as np
    run = json.loads((vendor.DATA_DIR / "bench_mla.json").read_text())
    rng = np.random.default_rng(0)
    speed = {"mla:baseline": 1.0, "mla:native_v": 1 / 1.1, "mla:split_rope": 1.0, "mla:rect": 1 / 1.2}
    for r in run["cases"]:
        r.pop("paired_vs", None)
        if r["status"] == "ok":
            r["times"] = list(speed.get(r["impl"], 1.0) * np.exp(rng.normal(0, noise, rounds)))
    path = tmp_path / f"bench_mla_{noise}.json"
    path.write_text(json.dumps(run))
    return str(path)


def test_the_cpu_column_prints_a_resolved_ratio_with_its_interval(tmp_path):
    """A 10 % effect with 1 % noise over 20 rounds: the cell is the median paired ratio and
    its 95 % interval, within ±5 %."""
    e = vendor.row("fa_forward", mla_bench_json=_noisy_mla_run(tmp_path, 0.01, 20)).estimates["cpu"]
    assert e.known and e.resolved and e.low == pytest.approx(1.1, rel=0.02)
    m = re.fullmatch(r"(\d\.\d\d) \((\d\.\d\d)–(\d\.\d\d)\)", e.text)
    assert m, e.text
    lo, hi = float(m.group(2)), float(m.group(3))
    assert lo <= float(m.group(1)) <= hi and hi / lo < (1 + vendor.CPU_RESOLUTION) ** 2
    assert "median of 20 paired interleaved rounds" in e.note and "resolved" in e.note


@pytest.mark.parametrize("noise, rounds", [(0.3, 20), (0.01, 3)])
def test_the_cpu_column_labels_an_unresolved_run(tmp_path, noise, rounds):
    """Noise of 30 % a call, or three rounds however tight: every CPU ratio of the table is
    "unresolved" with its interval, and gives no value the verdicts or chapters could read."""
    rows = vendor.vendor_table(mla_bench_json=_noisy_mla_run(tmp_path, noise, rounds))
    cpu = {r.key: r.estimates["cpu"] for r in rows}
    for key in ("fa_forward", "fa_backward", "concat_share", "inplace", "end_to_end"):
        e = cpu[key]
        assert e.text.startswith("unresolved (") and not e.known and not e.resolved, (key, e.text)
        assert "unresolved" in e.note
        assert ("fewer than 10 rounds" in e.note) == (rounds < 10)
    table = vendor.table_markdown(["fa_forward"], mla_bench_json=_noisy_mla_run(tmp_path, noise, rounds))
    assert "| unresolved (" in table and "Not modelled — CPU runs" not in table


def test_the_committed_cpu_ratios_are_their_stored_medians():
    """The committed MLA run stores each row's paired ratios (``paired_vs``, CPU clock); the table
    reads them, and they are what the times give."""
    run = json.loads((vendor.DATA_DIR / "bench_mla.json").read_text())
    assert run["config"]["clock"] == "cpu" and run["machine"]["numba_threads"] == 1
    assert any("CPU time" in n for n in run["notes"])
    rows = {(r["impl"], r["direction"], r["n"]): r for r in run["cases"] if r["section"] == "mla"}
    for (impl, direction, n), r in rows.items():
        for other, stored in r["paired_vs"].items():
            again = paired_ratio_of_rows(rows[other, direction, n], r)
            assert PairedRatio.from_dict(stored) == again, (impl, other, direction, n)
    e = vendor.row("fa_forward").estimates["cpu"]
    s = int(re.search(r"S = (\d+)", e.note).group(1))
    stored = PairedRatio.from_dict(rows["mla:native_v", "forward", s]["paired_vs"]["mla:baseline"])
    assert e.text.startswith(f"{stored.median:.2f} (") or e.text.startswith("unresolved")


def test_the_fused_rows_cpu_cells_read_the_cpu_clock_run(tmp_path):
    """The CPU cells of "llama_step" and "cann_5x" are numpy naive / flashlab forward of
    ``bench_fused_cpu.json`` (one thread's user-mode CPU time, paired rounds, each timed call after
    one of the same case), and they follow its times."""
    path = vendor.DATA_DIR / "bench_fused_cpu.json"
    run = json.loads(path.read_text())
    assert run["config"]["clock"] == "user" and run["config"]["warm_each"] and run["machine"]["numba_threads"] == 1
    rows = {r["impl"]: r for r in run["cases"] if r["section"] == "attention" and r["direction"] == "forward"
            and r["status"] == "ok" and not r["causal"] and r["d_qk"] == 128}
    stored = PairedRatio.from_dict(rows["flashlab"]["paired_vs"]["numpy_naive"])
    assert stored.resolved, stored        # the committed run tells a 10 % effect from none
    for key in ("llama_step", "cann_5x"):
        e = vendor.row(key).estimates["cpu"]
        lo_hi = f"({stored.low:.2f}–{stored.high:.2f})"
        assert e.text == (f"{stored.median:.2f} {lo_hi}" if stored.resolved else f"unresolved {lo_hi}"), e.text
        assert f"N = {rows['flashlab']['n']}" in e.note and "user-mode CPU time" in e.note
    for r in run["cases"]:
        if r["impl"] == "numpy_naive" and r["direction"] == "forward":
            r["times"] = [2 * t for t in r["times"]]
    for r in run["cases"]:
        r.pop("paired_vs", None)       # the ratio is then computed from the times
    doubled = tmp_path / "bench_fused_doubled.json"
    doubled.write_text(json.dumps(run))
    again = vendor.cpu_ratio([r for r in run["cases"] if r["impl"] == "numpy_naive"][0], rows["flashlab"])
    assert again.median == pytest.approx(2 * stored.median)     # the times doubled, the ratio follows
    after = vendor.row("llama_step", bench_json=str(doubled)).estimates["cpu"]
    assert f"{2 * stored.median:.2f}" in after.text + after.note
