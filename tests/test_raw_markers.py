"""No raw MyST markers where a student looks (issue 34 point 3).

The book's HTML renders ``{cite}`key``` and ``{doc}`chapter``` in markdown cells and (with
``nb_render_markdown_format: myst``) in a code cell's Markdown output; JupyterLab, Colab and a
handout show an output's Markdown as CommonMark, where a role is printed as it is written. So the
tables code cells print spell citations and links as text (:func:`flashlab.viz.markdown_table`,
:func:`flashlab.vendor.table_markdown`), and this scans every stored output of every notebook and
every cell of every handout for a role or a colon-fence directive.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from flashlab import vendor
from flashlab.viz import markdown_table
from tools import handout

ROOT = Path(__file__).resolve().parent.parent
#: a MyST role (``{cite}`...```) or the opening of a colon-fence directive (``:::{admonition}``)
RAW = re.compile(r"\{[a-z]+\}`|:::\{[a-z]+\}")


def _output_texts(output: dict) -> list[str]:
    texts = ["".join(output.get("text", ""))]
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            texts.append("".join(value) if isinstance(value, list) else value)
    return texts


def _raw_in_outputs(nb: dict) -> list[str]:
    found = []
    for i, cell in enumerate(nb["cells"]):
        for output in cell.get("outputs", []):
            for text in _output_texts(output):
                found += [f"cell {i}: ...{text[max(0, m.start() - 40):m.end() + 30]}..."
                          for m in RAW.finditer(text)]
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "book").glob("*.ipynb")), ids=lambda p: p.stem)
def test_no_stored_output_shows_a_raw_marker(path):
    found = _raw_in_outputs(json.loads(path.read_text()))
    assert not found, f"{path.name}: raw MyST in a stored output (re-execute it?):\n" + "\n".join(found[:5])


def test_no_handout_shows_a_raw_marker(tmp_path):
    for path in handout.write_handouts(tmp_path):
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "markdown":
                text = "".join(cell["source"])
                assert not RAW.search(text), f"{path.name} cell {i}: {text[:200]}"
        assert not _raw_in_outputs(nb)


def test_tables_write_citations_and_links_as_text():
    md = markdown_table(["quantity", "chapter", "source"],
                        [["heads", "{doc}`mla`", "{cite}`dao2022flashattention, shah2024`"],
                         ["tiles", "{doc}`the pipeline <pipeline>`", "{func}`flashlab.cost.attention_cost`"]])
    assert not RAW.search(md)
    assert "| heads | *mla* | [dao2022flashattention, shah2024] |" in md
    assert "| tiles | the pipeline | `flashlab.cost.attention_cost` |" in md
    table = vendor.table_markdown()
    assert not RAW.search(table) and "[ascend2025rectfa]" in table


def test_the_scan_sees_a_raw_marker():
    nb = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "execute_result", "data": {"text/markdown": "| a | {cite}`x` |"}}]}]}
    assert _raw_in_outputs(nb)
