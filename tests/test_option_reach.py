"""Issue 32's newcomer test, kept: which package files a scores option reaches.

The logit soft-cap is the example option. The package files that mention ``softcap`` at all
(code, comment or docstring) are exactly :data:`REACH`, each for the reason given: the options
record, the scores stage's scalar math, and what a reader must see (the float64 truth and the
three doors whose signatures spell flash_attn's keyword). Every kernel (the CPU forward,
backward and decode, the GPU twin's two) and the walk, the checks and the GPU door reach it
through the record: the kernels call the stage's steps (:mod:`flashlab.kernels.scorestep`,
compiled with ``njit`` and ``cuda.jit(device=True)`` from one source), :func:`prepare
<flashlab.validation.prepare>` hands its keywords to the record's rule
(:func:`flashlab.kernels.options.scores_stage`), and the walk and the GPU door pass theirs
through. A change that makes another file name the option fails here, so the reach can only grow
on purpose.
"""
from __future__ import annotations

import io
import tokenize
from pathlib import Path

import flashlab

PACKAGE = Path(flashlab.__file__).parent

#: the options record (not counted in issue 32's budget of five more files)
RECORD = "kernels/options.py"
#: package file -> why it mentions the soft-cap
REACH = {
    RECORD: "the scores stage's record: the field, its default and its rule",
    "kernels/scorestep.py": "the stage's scalar math, one source for the CPU and the GPU: the cap and its slope",
    "reference.py": "the float64 truth, forward and backward, written apart from the kernels",
    "api.py": "the kernel API's keyword",
    "compat.py": "flash_attn's own argument, in its position",
    "torch_attention.py": "the torch door's op schema (a custom op spells every argument)",
}
#: files that must never mention a scores option: they take it from the record or the stage
OPTION_FREE = ("kernels/forward.py", "kernels/backward.py", "kernels/decode.py", "kernels/tile.py",
               "walk.py", "validation.py", "gpu/attention.py", "gpu/forward.py", "gpu/backward.py",
               "gpu/bench.py")


def _names(path: Path, word: str) -> int:
    """How many name tokens of ``path`` contain ``word`` (comments and strings excluded)."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return sum(1 for t in tokens if t.type == tokenize.NAME and word in t.string)


def _mentions(path: Path, word: str) -> bool:
    """Whether ``word`` appears anywhere in ``path`` (code, comments, docstrings)."""
    return word in path.read_text()


def test_softcap_reaches_exactly_these_files():
    reached = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if _mentions(p, "softcap")}
    assert reached == set(REACH), (sorted(reached - set(REACH)), sorted(set(REACH) - reached))


def test_five_files_beyond_the_record():
    # issue 32, point 3: the feature touches at most 5 package files beyond the options record
    assert len(set(REACH) - {RECORD}) <= 5
    # and each of them names it in code (none is there for a stale comment)
    for name in REACH:
        assert _names(PACKAGE / name, "softcap") > 0, name


def test_the_kernels_the_walk_and_the_checks_mention_no_scores_option():
    for name in OPTION_FREE:
        assert not _mentions(PACKAGE / name, "softcap"), name
