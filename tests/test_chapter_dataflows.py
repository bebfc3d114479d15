"""Standard attention has one traffic count per named dataflow, and every chapter names the one it prints.

Two dataflows of :func:`flashlab.traffic.traffic` count standard attention: ``"standard"``
(Algorithm 0 as three unfused operators, each reading its inputs once: the count of the early
chapters and of torch's unfused pipeline) and ``"gpu:standard"`` (the CUDA twin's three kernels,
K and V re-read per row tile, S read twice). A chapter may print a byte count of standard
attention only through one of them, by name: this test reads every chapter's code and fails on
a dataflow ``traffic.traffic`` does not give, on a byte count computed by a lower-level helper
instead, and on a chapter that uses a standard dataflow without naming it where the reader sees
it (a markdown cell or an output). The helpers the chapters may still call are checked to equal
their dataflow.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flashlab import flops, traffic

BOOK = Path(__file__).resolve().parent.parent / "book"
#: the API reference lists every name; it prints no counts
NOT_CHAPTERS = {"api.ipynb"}
#: lower-level closed forms of standard attention's bytes: a chapter calls traffic.traffic instead
HELPERS = ("hbm_elements_standard", "standard_attention_traffic")
#: helpers whose standard-attention entry is a named dataflow (checked below), allowed in chapters
NAMED_HELPERS = {"operation_costs": "standard"}
STANDARD_DATAFLOWS = ("standard", "gpu:standard")
CALL = re.compile(r"\b(backward_traffic|traffic)\(\s*(['\"])([^'\"]+)\2")


def chapters() -> list[Path]:
    return sorted(p for p in BOOK.glob("*.ipynb") if p.name not in NOT_CHAPTERS)


def cells(path: Path) -> tuple[str, str]:
    """(all code, all text a reader sees: markdown, outputs and figure captions) of a notebook."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    code, seen = [], []
    for c in nb["cells"]:
        src = "".join(c["source"])
        seen.append(c.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("caption", ""))
        if c["cell_type"] == "code":
            code.append(src)
            for o in c.get("outputs", []):
                seen.append("".join(o.get("text", "")))
                for kind in ("text/markdown", "text/plain"):
                    seen.append("".join(o.get("data", {}).get(kind, "")))
        else:
            seen.append(src)
    return "\n".join(code), "\n".join(seen)


def dataflows_used(code: str) -> set[tuple[str, str]]:
    return {(fn, name) for fn, _, name in CALL.findall(code)}


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.name)
def test_chapter_prints_only_named_dataflows(path):
    code, seen = cells(path)
    used = dataflows_used(code)
    for fn, name in used:
        known = traffic.TRAFFIC_DATAFLOWS if fn == "traffic" else traffic.BACKWARD_TRAFFIC_DATAFLOWS
        assert name in known, f"{path.name}: cost.{fn}({name!r}): not a dataflow cost.{fn} gives"
    for helper in HELPERS:
        assert not re.search(rf"\b{helper}\(", code), (
            f"{path.name} computes standard attention's bytes with cost.{helper}: print them through "
            f"traffic.traffic's named dataflows {STANDARD_DATAFLOWS}")
    standard = {name for _, name in used if name in STANDARD_DATAFLOWS}
    standard |= {name for helper, name in NAMED_HELPERS.items() if re.search(rf"\b{helper}\(", code)}
    for name in standard:
        assert re.search(rf"[\"'`]{re.escape(name)}[\"'`]", seen), (
            f"{path.name} prints standard attention's bytes from the dataflow {name!r} without naming it "
            f"in its text or outputs")


def test_the_scan_catches_an_unknown_dataflow_and_a_helper():
    code = 'x = traffic.traffic("naive", seq_q=8)\ny = traffic.hbm_elements_standard(8, 8, 4, 4)'
    assert ("traffic", "naive") in dataflows_used(code)
    assert "naive" not in traffic.TRAFFIC_DATAFLOWS
    assert re.search(r"\bhbm_elements_standard\(", code)


@pytest.mark.parametrize("sq, sk, d, dv, elem", [(4096, 4096, 64, 64, 4), (300, 200, 128, 64, 2)])
def test_helpers_equal_their_dataflow(sq, sk, d, dv, elem):
    kw = dict(seq_q=sq, seq_k=sk, d_qk=d, d_v=dv, elem=elem)
    alg0 = traffic.traffic("standard", **kw)
    assert alg0.total == elem * traffic.hbm_elements_standard(sq, sk, d, dv)
    assert flops.operation_costs(sq, sk, d, dv, elem=elem)["standard attention"][1] == alg0.total
    gpu = traffic.traffic("gpu:standard", **kw, block_q=32)
    assert gpu == traffic.standard_attention_traffic(sq, sk, d, dv, tile=32, elem=elem)
    assert gpu.total > alg0.total        # two dataflows, two counts (K/V re-reads, S read twice)
