"""Issue 32's newcomer test, kept: which package files a scores option reaches.

The logit soft-cap is the example option: the files whose *code* names ``softcap`` (a name
token, not a comment or a docstring) are exactly :data:`REACH`, each for the reason given. The
kernels (forward, backward, decode) and the walk never name it: they read the scores from the
one stage (:func:`flashlab.kernels.tile.tile_scores`), which also says whether the backward must
chain ``dS`` through a derivative (:func:`flashlab.kernels.tile.scores_chain`), and the walk
hands its options to :func:`flashlab.validation.prepare`. A change that makes another file name
the option fails here, so the reach can only grow on purpose.
"""
from __future__ import annotations

import io
import tokenize
from pathlib import Path

import flashlab

PACKAGE = Path(flashlab.__file__).parent

#: package file -> why it names the soft-cap
REACH = {
    "kernels/options.py": "the options record's field",
    "kernels/tile.py": "the scores stage: the cap and its derivative",
    "reference.py": "the float64 truth, forward and backward",
    "validation.py": "the argument's rule and the checked Problem's field",
    "api.py": "the kernel API's keyword, and the record built from the problem",
    "compat.py": "flash_attn's own argument",
    "torch_attention.py": "the torch door's op schema and autograd",
    "gpu/attention.py": "the GPU twin's keyword and its kernels' scalar arguments",
    "gpu/forward.py": "the GPU twin's forward applies the cap",
    "gpu/backward.py": "the GPU twin's backward applies the cap and its derivative",
}
#: files that must never name a scores option (they take it from the stage or the record)
OPTION_FREE = ("kernels/forward.py", "kernels/backward.py", "kernels/decode.py", "walk.py", "gpu/bench.py")


def _names(path: Path, word: str) -> int:
    """How many name tokens of ``path`` contain ``word`` (comments and strings excluded)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return sum(1 for t in tokens if t.type == tokenize.NAME and word in t.string)


def test_softcap_reaches_exactly_these_files():
    reached = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if _names(p, "softcap")}
    assert reached == set(REACH), (sorted(reached - set(REACH)), sorted(set(REACH) - reached))


def test_the_kernels_and_the_walk_name_no_scores_option():
    for name in OPTION_FREE:
        assert _names(PACKAGE / name, "softcap") == 0, name
