"""The examples in the package's docstrings are run: a ``>>>`` line whose output changed
(a new numpy repr, a changed default) fails here instead of misleading a reader."""
import doctest
import importlib
import pkgutil
import warnings

import pytest

import flashlab

#: modules not imported here: torch_attention needs torch (optional, benchmarks only)
SKIP = {"flashlab.torch_attention"}
MODULES = sorted(m.name for m in pkgutil.walk_packages(flashlab.__path__, "flashlab.")
                 if m.name not in SKIP and ".bench.__main__" not in m.name)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"


def test_the_examples_are_found():
    """Guards the test above against finding nothing (e.g. a Numba dispatcher hiding its doc)."""
    from flashlab import dropout

    found = {t.name: len(t.examples) for t in doctest.DocTestFinder().find(dropout)}
    assert found["flashlab.dropout.keep_mask"] >= 1
    assert found["flashlab.dropout.inv_keep_probability"] >= 1    # an @njit function's too
