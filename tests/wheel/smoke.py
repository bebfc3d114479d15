"""Smoke test of an installed flashlab (a wheel, not the repository): run from an empty folder.

Calls every function of ``flashlab.__all__`` on small shapes, reads the vendor tables and the
package data, and renders the explorers' static fallbacks (the tile walk and the pipeline
animation, the pipeline grid). tests/test_wheel.py runs it with the wheel venv's Python.
Prints one line per check and "smoke: N checks passed" at the end; any failure raises.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402

import flashlab  # noqa: E402

here = Path(flashlab.__file__).resolve()
assert "site-packages" in here.parts, f"flashlab imported from {here}, not from the installed wheel"
assert not Path("flashlab").exists() and not Path("book").exists(), "run from an empty folder"
checks = []


def ok(what: str) -> None:
    checks.append(what)
    print("ok", what)


rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 13, 8)).astype(np.float32) for _ in range(3))
o_ref, lse_ref = flashlab.attention_reference(q, k, v, causal=True)
o, lse = flashlab.flash_attention(q, k, v, causal=True, block_q=4, block_k=4)
assert np.allclose(o, o_ref, atol=1e-5) and np.allclose(lse, lse_ref, atol=1e-5)
ok("flash_attention, attention_reference")
o_naive = flashlab.attention_naive(q, k, v, causal=True)
o_naive = o_naive[0] if isinstance(o_naive, tuple) else o_naive
assert np.allclose(o_naive, o_ref, atol=1e-5)
ok("attention_naive")
do = rng.standard_normal(o.shape).astype(np.float32)
grads = flashlab.flash_attention_backward(do, q, k, v, o, lse, causal=True, block_q=4, block_k=4)
grads_ref = flashlab.attention_reference_backward(do, q, k, v, causal=True)
assert all(np.allclose(a, b, atol=1e-4) for a, b in zip(grads, grads_ref))
ok("flash_attention_backward, attention_reference_backward")
tiles = flashlab.tiles_computed(q, k, v, causal=True, block_q=4, block_k=4)
assert int(np.sum(tiles)) == 2 * 10            # 4 q-blocks: 1 + 2 + 3 + 4 tiles per head
ok("tiles_computed")
bnsd = [x.astype(np.float32) for x in (q, k, v)]
out, smax, ssum = flashlab.flash_attention_score(*bnsd, 2, "BNSD", scale=8 ** -0.5, sparse_mode=2,
                                                 atten_mask=np.triu(np.ones((2048, 2048), bool), 1))
assert np.allclose(out, o_ref, atol=1e-5)
ok("flash_attention_score")
g = flashlab.flash_attention_score_grad(*bnsd, do, 2, "BNSD", softmax_max=smax, softmax_sum=ssum,
                                        attention_in=out, scale=8 ** -0.5, sparse_mode=2,
                                        atten_mask=np.triu(np.ones((2048, 2048), bool), 1))
assert all(np.allclose(a, b, atol=1e-4) for a, b in zip(g[:3], grads_ref))
ok("flash_attention_score_grad")
assert set(flashlab.__all__) <= {"flash_attention", "flash_attention_backward", "tiles_computed",
                                 "flash_attention_score", "flash_attention_score_grad",
                                 "attention_reference", "attention_naive",
                                 "attention_reference_backward"}, "a new public function: smoke it here"

import flashlab.data  # noqa: E402
from flashlab import vendor  # noqa: E402

assert flashlab.data.names() and flashlab.data.load_json("bench.json")["machine"]
rows = vendor.vendor_table()
assert rows and "|" in vendor.table_markdown()
ok(f"package data ({len(flashlab.data.names())} files), vendor_table ({len(rows)} rows)")

from flashlab.widgets import pipeline as wp  # noqa: E402
from flashlab.widgets import tiles as wt  # noqa: E402

html = wt.tile_walk_animation(16, 16, 8, 8, mask_kind="causal", dpi=40).to_jshtml()
assert "<img" in html or "data:image/png" in html
ok("tile explorer's static animation")
html = wp.pipeline_animation(frames=3, dpi=40).to_jshtml()
assert "data:image/png" in html
wp.pipeline_grid(tiles=[(64, 128)])
ok("pipeline explorer's static animation and grid")
from flashlab.widgets import RooflineExplorer  # noqa: E402

html = RooflineExplorer().static_html()          # explorer.js is package data of the wheel
assert "window.flashlabExplorer" in html and 'class="fx-data"' in html
ok("static explorer with its renderer (explorer.js)")
print(f"smoke: {len(checks)} checks passed ({sys.executable}, cwd {os.getcwd()})")
