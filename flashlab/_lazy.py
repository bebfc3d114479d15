"""PEP 562 package faces: a package's public names are imported on first use, not on import.

``import flashlab.pipeline`` then loads the pure-Python hardware model only, never Numba (which
the kernels behind ``flashlab.flash_attention`` need, and take seconds to load).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_face(package: str, exports: Mapping[str, Iterable[str]]
              ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps each module to the names it
    provides. A name is looked up in its module on first access (and cached in the package's
    namespace); any other name is tried as a submodule, as ``import package.name`` would.
    """
    home = {name: module for module, names in exports.items() for name in names}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name in home:
            value = getattr(importlib.import_module(home[name]), name)
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as e:
                if e.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(home))

    return __getattr__, __dir__
