"""Show package source in a chapter: the code the reader sees is the code that runs."""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import IPython.display

__all__ = ["show_source"]


def show_source(*objs) -> "IPython.display.Markdown":
    """The source of one or more functions, classes or modules as one highlighted Python block
    (several are separated by a blank line, in the order given).

    Returned as ``IPython.display.Markdown`` so the notebook and the HTML book both render
    it as a code block (and nbval compares it as text).
    """
    from IPython.display import Markdown

    return Markdown("```python\n" + "\n\n".join(inspect.getsource(o) for o in objs) + "```")
