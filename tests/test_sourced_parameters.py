"""Every number of the Ascend 910B profiles carries its status: published (with a bibliography
key), derived (with its formula) or assumed (with the range considered)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from flashlab.pipeline.core_fit import ASCEND_910B_CALIBRATED_CORE
from flashlab.pipeline.params import Param, params
from flashlab.pipeline.profiles import ASCEND_910B, ASCEND_910B_AI_CORE, citation

BIB = (Path(__file__).resolve().parent.parent / "book" / "references.bib").read_text()
KEYS = set(re.findall(r"@\w+\{([^,]+),", BIB))


@pytest.mark.parametrize("profile", [ASCEND_910B, ASCEND_910B_AI_CORE, ASCEND_910B_CALIBRATED_CORE],
                         ids=["chip", "core", "calibrated core"])
def test_every_ascend_number_is_sourced(profile):
    for name, p in params(profile):
        if p.status == "published":
            assert citation(p) in KEYS, f"{name}: published without a bibliography key ({p.source})"
        elif p.status == "derived":
            assert re.search(r"[x*/=]", p.source), f"{name}: derived without its formula ({p.source})"
        else:
            assert p.low is not None and p.low <= p.value <= p.high, f"{name}: assumed without a range"


def test_param_range_is_checked():
    with pytest.raises(ValueError, match="range must contain the value"):
        Param(2.0, "B/s", "x", "assumption", 3.0, 4.0)
    with pytest.raises(ValueError, match="low and high come together"):
        Param(2.0, "B/s", "x", "assumption", 1.0)
