"""No silent waits (issue 34 point 2): every cell that compiles Numba kernels for more than 5 s on
a cold cache has a one-line notice right before it, stating the measured time; the instructor
guide's cold and warm run times are the committed measurements (tools/compile_times.py,
flashlab/data/compile_times.json: each chapter run alone from an empty NUMBA_CACHE_DIR, then
again, on a named machine). Timing nothing here: the test reads the measurements."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import flashlab.data
from tools import compile_times
from tools.colab_cell import chapter_notebooks

ROOT = Path(__file__).resolve().parent.parent
DATA = flashlab.data.load_json("compile_times.json")


def test_every_chapter_is_measured_on_a_named_machine():
    assert set(DATA["chapters"]) == {p.stem for p in chapter_notebooks()}
    machine = DATA["machine"]
    assert machine["cpus"] and machine["processor"] and machine["blas"]
    assert DATA["notice_seconds"] == compile_times.NOTICE_SECONDS == 5.0
    for chapter in DATA["chapters"].values():
        assert chapter["cold_total"] >= chapter["warm_total"] > 0 and len(chapter["load_average"]) == 2


def _problems(nb: dict, chapter: dict) -> list[str]:
    cells = nb["cells"]
    index = {c.get("id"): i for i, c in enumerate(cells)}
    problems = []
    wanted = compile_times.compiling(chapter)
    for c in wanted:
        i = index.get(c["id"])
        if i is None:
            problems.append(f"cell {c['id']} ({c['first_line'][:40]}) is gone: re-measure the chapter")
            continue
        before = cells[i - 1]
        if before["cell_type"] != "markdown" or "".join(before["source"]) != compile_times.notice(c["seconds"]):
            problems.append(f"no notice before cell {c['id']} ({c['first_line'][:40]}, {c['seconds']} s cold): "
                            f"add the markdown line {compile_times.notice(c['seconds'])!r}")
    ids = {compile_times.notice_id(c["id"]) for c in wanted}
    problems += [f"stale notice {c['id']}" for c in cells
                 if c.get("id", "").startswith("compile-notice-") and c["id"] not in ids]
    return problems


@pytest.mark.parametrize("stem", sorted(DATA["chapters"]))
def test_a_notice_precedes_every_cell_that_compiles_for_more_than_5_s(stem):
    nb = json.loads((ROOT / "book" / f"{stem}.ipynb").read_text())
    problems = _problems(nb, DATA["chapters"][stem])
    assert not problems, f"{stem} (python tools/compile_times.py --notices {stem}):\n" + "\n".join(problems)


def test_the_check_sees_a_missing_notice():
    nb = {"cells": [{"cell_type": "markdown", "id": "a", "source": ["text"]},
                    {"cell_type": "code", "id": "b", "source": ["flash_attention(q, k, v)"]}]}
    chapter = {"cells": [{"id": "b", "first_line": "flash_attention(q, k, v)", "seconds": 12.0,
                          "warm_seconds": 0.1}]}
    assert _problems(nb, chapter)
    nb["cells"].insert(1, {"cell_type": "markdown", "id": "compile-notice-b",
                           "source": [compile_times.notice(12.0)]})
    assert not _problems(nb, chapter)
    assert "about 10 s" in compile_times.notice(12.0)


def test_the_guide_states_the_measured_cold_and_warm_times():
    guide = (ROOT / "book" / "instructor.md").read_text()
    rows = {m.group(1): (m.group(2), m.group(3))
            for m in re.finditer(r"^\| \{doc\}`(\w+)`[^|]*\| [^|]+ \| (\d+) s \| (\d+) s \|", guide, flags=re.M)}
    assert set(rows) == set(DATA["chapters"])
    for stem, chapter in DATA["chapters"].items():
        assert rows[stem] == (f"{chapter['cold_total']:.0f}", f"{chapter['warm_total']:.0f}"), stem
    blas = DATA["machine"]["blas"]          # e.g. "openblas 0.3.31.188.0 (SkylakeX)"
    assert blas.split()[0] in guide.lower() and blas.split("(")[-1].rstrip(")") in guide
    assert f"{DATA['machine']['cpus']}-core" in guide
