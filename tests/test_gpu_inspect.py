"""The static report on the CUDA twin's kernels (flashlab.gpu.inspect): committed numbers, parsing, live run.

The live run needs ptxas and nvdisasm (pip install -r requirements-gpu-tools.txt) and no GPU;
without them it is skipped. The committed JSON (flashlab/data/gpu_inspect.json) holds the
kernels before and after the loop-order rewrite (issue 31); the tests hold it to the targets.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flashlab.data import load_json
from flashlab.gpu.inspect import DIMS, KERNEL_NAMES, ptxas_resources, sass_loops, table, tool_paths

FUSED = ("forward", "backward")
#: kernels that did not exist before the rewrite: FlashAttention-2's D = rowsum(dO o O) kernel
NEW = ("backward_dot",)
PRODUCTS = ("forward", "backward", "standard_scores", "standard_pv")


def _targets_met(k: dict) -> bool:
    return (k["stack"] == 0 and k["spill_stores"] == 0 and k["spill_loads"] == 0
            and k["local_ops"] == 0 and all(x["per_ffma"] <= 2.0 for x in k["loops"]) and bool(k["loops"]))


def check_targets(report: dict, kernel: str) -> list[str]:
    """Names of ``kernel``'s entries (every d) that miss: no local memory, no spills, <= 2 / FFMA."""
    return [f"{kernel} d={d}" for d in DIMS if not _targets_met(report["kernels"][f"{kernel} d={d}"])]


def test_committed_report_has_every_kernel_before_and_after():
    doc = load_json("gpu_inspect.json")
    for label in ("before", "after"):
        run = doc[label]
        assert run["arch"] == "sm_90" and run["versions"]["ptxas"] and run["date"]
        kernels = [k for k in KERNEL_NAMES if label == "after" or k not in NEW]
        assert set(run["kernels"]) == {f"{k} d={d}" for k in kernels for d in DIMS}


@pytest.mark.parametrize("kernel", PRODUCTS)
def test_committed_after_meets_the_targets(kernel):
    assert check_targets(load_json("gpu_inspect.json")["after"], kernel) == []


def test_committed_dot_kernel_has_no_local_memory():
    # the backward's preprocessing streams dO and O: no product loop, nothing in local memory
    after = load_json("gpu_inspect.json")["after"]["kernels"]
    for d in DIMS:
        k = after[f"backward_dot d={d}"]
        assert k["stack"] == k["local_ops"] == k["spill_stores"] == k["spill_loads"] == 0


def test_committed_before_shows_the_local_memory_loop():
    # the old fused kernels: the PV loop's accumulator in local memory, ~19 instructions per FFMA
    before = load_json("gpu_inspect.json")["before"]["kernels"]
    for kernel in FUSED:
        for d in DIMS:
            k = before[f"{kernel} d={d}"]
            assert k["stack"] > 0 and k["local_ops"] > 0
            assert max(x["per_ffma"] for x in k["loops"]) > 10


def test_table_rows_in_kernel_order():
    doc = load_json("gpu_inspect.json")
    lines = table(doc).splitlines()
    assert lines[0].startswith("| kernel | registers before") and "insns/FFMA (worst loop) after" in lines[0]
    assert [line.split(" | ")[0][2:] for line in lines[2:]] == [f"{k} d={d}" for k in KERNEL_NAMES for d in DIMS]
    one = table(doc["after"]).splitlines()
    assert one[0].startswith("| kernel | registers | spills (B)") and len(one) == len(lines)
    with pytest.raises(TypeError, match="report must be a dict"):
        table([])
    with pytest.raises(ValueError, match="'kernels'"):
        table({"before": {}})


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDS R2, [R3] ;
        /*0020*/                   FFMA R4, R2, R2, R4 ;
        /*0030*/                   FFMA R5, R2, R2, R5 ;
.L_x_1:
        /*0040*/                   LDL R6, [R1] ;
        /*0050*/                   FFMA R6, R6, R2, R6 ;
        /*0060*/                   STL [R1], R6 ;
        /*0070*/                   NOP ;
        /*0080*/               @P0 BRA `(.L_x_1) ;
        /*0090*/               @P1 BRA `(.L_x_0) ;
        /*00a0*/                   EXIT ;
"""


def test_sass_loops_takes_innermost_loops_with_ffma():
    loops, local_ops = sass_loops(SASS)
    # .L_x_1 .. its branch: LDL, FFMA, STL, BRA (the NOP not counted); the outer loop holds it
    assert loops == [{"insns": 4, "ffma": 1, "per_ffma": 4.0}]
    assert local_ops == 2


def test_ptxas_resources_parses_and_refuses():
    log = ("ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem\n"
           "ptxas info    : Function properties for k\n"
           "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n")
    assert ptxas_resources(log) == {"registers": 40, "stack": 16, "spill_stores": 8, "spill_loads": 4}
    with pytest.raises(ValueError, match="ptxas -v"):
        ptxas_resources("nothing")


def test_live_inspection_meets_the_targets(tmp_path):
    if tool_paths() is None:
        pytest.skip("ptxas / nvdisasm not installed: pip install -r requirements-gpu-tools.txt")
    out = tmp_path / "report.json"
    # a fresh process: the inspection selects the real numba.cuda (the suite uses the simulator)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    run = subprocess.run([sys.executable, "-m", "flashlab.gpu.inspect", "--json", str(out)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    for kernel in PRODUCTS:
        assert check_targets(report, kernel) == [], kernel
    assert "| forward d=64 |" in run.stdout
