"""Show package source in a chapter: the code the reader sees is the code that runs."""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import IPython.display

__all__ = ["show_source"]


def show_source(obj) -> "IPython.display.Markdown":
    """The source of a function, class or module as a highlighted Python block.

    Returned as ``IPython.display.Markdown`` so the notebook and the HTML book both render
    it as a code block (and nbval compares it as text).
    """
    from IPython.display import Markdown

    return Markdown(f"```python\n{inspect.getsource(obj)}```")
