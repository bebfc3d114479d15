"""The shared look of the book's figures and tables: one palette, a figure helper, a table helper.

Colours are the Okabe-Ito set (Okabe & Ito, *Color Universal Design*, 2008), which stays
distinguishable under the common forms of colour-vision deficiency. They are named by the
*role* they play in a figure, so that "a full tile" or "the K operand" has the same colour in
every chapter.
"""
from __future__ import annotations

import re

import matplotlib.pyplot as plt

__all__ = ["OKABE_ITO", "PALETTE", "SERIES", "new_figure", "figure_for", "agg_canvas",
           "png_bytes", "background_of", "blit_png", "markdown_table", "animation_html"]

#: the eight Okabe-Ito colours by their usual names
OKABE_ITO: dict[str, str] = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}

#: colours by role; look roles up here rather than writing hex codes in a drawing
PALETTE: dict[str, str] = {
    # tile classes (flashlab.masks): skipped, computed with a mask, computed without one
    "empty": "#EEEEEE",
    "partial": OKABE_ITO["orange"],
    "full": OKABE_ITO["blue"],
    # attention operands and results
    "q": OKABE_ITO["blue"],
    "k": OKABE_ITO["vermillion"],
    "v": OKABE_ITO["bluish_green"],
    "o": OKABE_ITO["reddish_purple"],
    "s": OKABE_ITO["orange"],
    "p": OKABE_ITO["yellow"],
    "rope": OKABE_ITO["sky_blue"],
    # roofline and pipeline roles
    "compute": OKABE_ITO["blue"],
    "memory": OKABE_ITO["vermillion"],
    "vector": OKABE_ITO["bluish_green"],
    "mte": OKABE_ITO["orange"],
    "idle": "#DDDDDD",
    "highlight": OKABE_ITO["reddish_purple"],
    "text": OKABE_ITO["black"],
    "grid": "#BBBBBB",
}

#: a cycle for plots with several series of the same role (e.g. several hardware profiles)
SERIES: tuple[str, ...] = (
    OKABE_ITO["blue"], OKABE_ITO["vermillion"], OKABE_ITO["bluish_green"],
    OKABE_ITO["orange"], OKABE_ITO["reddish_purple"], OKABE_ITO["sky_blue"],
    OKABE_ITO["black"],
)


def new_figure(w: float = 6.0, h: float = 4.0, *, nrows: int = 1, ncols: int = 1,
               dpi: int = 80, **subplot_kw):
    """A small figure of ``w x h`` inches with ``nrows x ncols`` axes in book style.

    Returns ``(fig, ax)`` (``ax`` an array when ``nrows * ncols > 1``), like
    :func:`matplotlib.pyplot.subplots`. ``dpi`` defaults low so notebooks stay small.
    """
    if w <= 0 or h <= 0:
        raise ValueError(f"w and h must be positive inches, got w={w}, h={h}")
    fig, ax = plt.subplots(nrows, ncols, figsize=(w, h), dpi=dpi, layout="constrained",
                           **subplot_kw)
    return fig, ax


def figure_for(ax, w: float, h: float):
    """``(fig, ax)``: ``ax`` and its figure, or, when ``ax`` is None, a new ``w x h`` book figure
    with one axes (the drawing functions take an optional ``ax`` to draw into a panel)."""
    if ax is None:
        return new_figure(w, h)
    return ax.figure, ax


def agg_canvas(fig):
    """``fig``'s Agg canvas, given to it if it has another one (a plain
    :class:`~matplotlib.figure.Figure` has a canvas that cannot render). The figure keeps it, so
    the next draw reuses its renderer and the text metrics cached with it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas
    return canvas if isinstance(canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)


def png_bytes(fig) -> bytes:
    """``fig`` as PNG bytes from one Agg draw (its layout engine, if any, runs in that draw).

    ``Figure.savefig`` draws a figure with a layout engine twice (once to settle the layout,
    once to render); the Agg canvas's ``print_png`` draws once.
    """
    import io

    buf = io.BytesIO()
    agg_canvas(fig).print_png(buf)
    return buf.getvalue()


def background_of(fig, changing: list) -> object:
    """The background that :func:`blit_png` draws ``changing`` over: ``fig`` rendered without
    those artists (``set_animated(True)`` keeps an artist out of a normal draw), copied from
    the canvas.

    A layout engine runs first (a draw without rendering) and is then switched off, so the
    layout stays the one the background has. Anything else a step changes -- axis limits,
    ticks -- must be set before this call and stay the same for every PNG blitted onto it.
    """
    canvas = agg_canvas(fig)
    if fig.get_layout_engine() is not None:
        fig.draw_without_rendering()
        fig.set_layout_engine("none")
    for a in changing:
        a.set_animated(True)
    canvas.draw()
    for a in changing:
        a.set_animated(False)
    return canvas.copy_from_bbox(fig.bbox)


def blit_png(fig, background, changing: list) -> bytes:
    """``fig`` as PNG bytes without a full draw: the ``background`` from
    :func:`background_of` is restored and only the ``changing`` artists are drawn over it.

    The result has the pixels of a full draw as long as ``changing`` is in the order a full draw
    draws those artists (within an axes: by zorder, then as ``Axes.get_children`` lists them)
    and no fixed artist is drawn over a changing one -- e.g. a patch that should cover grid
    lines needs a zorder above theirs. Costs a few milliseconds where a full draw of a figure
    with several axes costs tens: most of a draw is laying out and rasterising text.
    """
    import io

    import numpy as np
    from PIL import Image

    canvas = agg_canvas(fig)
    canvas.restore_region(background)
    renderer = canvas.get_renderer()
    for a in changing:
        a.draw(renderer)
    buf = io.BytesIO()
    # compress_level 3: 4.1 ms and 33 kB for a 640 x 352 step of the tile explorer, against
    # 5.9 ms and 35 kB at PIL's default 6
    Image.fromarray(np.asarray(canvas.buffer_rgba())).save(buf, format="png", compress_level=3)
    return buf.getvalue()


#: a MyST role, ``{cite}`key``` or ``{doc}`label <target>```: the book's HTML renders it, but
#: JupyterLab, Colab and a handout print a code cell's Markdown output as CommonMark, raw
_ROLE = re.compile(r"\{(?P<role>[a-z]+)\}`(?P<text>[^`]*)`")


def _plain_role(m: re.Match) -> str:
    role, text = m.group("role"), m.group("text").replace("\n", " ")
    if role == "cite":                                   # the bibliography keys, as the handouts print them
        return "[" + ", ".join(k.strip() for k in text.split(",")) + "]"
    if (labelled := re.fullmatch(r"(.*?)\s*<([^>]+)>", text)):
        return labelled.group(1)                         # {doc}`the pipeline chapter <pipeline>`
    if role == "doc":
        return f"*{text.rsplit('/', 1)[-1]}*"            # the chapter's page name
    return f"`{text}`" if role in ("func", "data", "class", "mod", "meth", "attr") else text


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A Markdown table: ``header`` names the columns, each row is a list of cells (already
    formatted as strings, or anything ``str()`` turns into one). Chapters show it with
    ``IPython.display.Markdown``. A MyST role in a cell (``{cite}`key```, ``{doc}`chapter```)
    is written as plain text (``[key]``, *chapter*): the same table reads right in the book,
    in JupyterLab, in Colab and in a handout, none of which but the book renders MyST in an
    output."""
    if any(len(r) != len(header) for r in rows):
        raise ValueError(f"every row must have {len(header)} cells like the header; "
                         f"got lengths {sorted({len(r) for r in rows})}")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_ROLE.sub(_plain_role, str(c)) for c in r) + " |" for r in rows]
    return "\n".join(lines)


#: Unicode stand-ins for the Font Awesome icons of matplotlib's animation player
_PLAYER_ICONS: dict[str, str] = {
    "fa-minus": "&minus;", "fa-fast-backward": "|&#9664;&#9664;", "fa-step-backward": "|&#9664;",
    "fa-play fa-flip-horizontal": "&#9664;", "fa-pause": "&#10074;&#10074;", "fa-play": "&#9654;",
    "fa-step-forward": "&#9654;|", "fa-fast-forward": "&#9654;&#9654;|", "fa-plus": "+",
}


def animation_html(anim, alt: str, *, caption: str | None = None):
    """The animation as a self-contained HTML player (matplotlib's ``to_jshtml``) with alt text.

    Two changes to matplotlib's player make it work for every reader:

    * ``to_jshtml`` writes its frame as ``<img id="_anim_img...">`` without an ``alt``
      attribute, so a screen reader announces nothing; this adds ``alt`` (a one-sentence
      description of what the animation shows) and, optionally, a visible ``caption``;
    * its buttons draw Font Awesome 4 icons from a CDN stylesheet, which fails offline (an
      error in the browser console and blank buttons); the stylesheet link is removed and each
      icon replaced by a plain Unicode symbol (the buttons keep their ``title``/``aria-label``).

    The player's JavaScript is inline: it plays in the static book with no kernel and no
    network. Returns an ``IPython.display.HTML`` object; raises ``ValueError`` for an empty
    ``alt``.
    """
    import html

    from IPython.display import HTML

    if not isinstance(alt, str) or not alt.strip():
        raise ValueError("alt must be a non-empty description of the animation")
    player = anim.to_jshtml()
    player = re.sub(r'<link rel="stylesheet"\s+href="[^"]*font-awesome[^"]*">', "", player)
    player = re.sub(r'<i class="fa ([^"]+)"></i>', lambda m: _PLAYER_ICONS.get(m.group(1), "?"), player)
    player = player.replace('<img id="_anim_img', f'<img alt="{html.escape(alt)}" id="_anim_img', 1)
    if caption:
        player = (f'<figure class="flashlab-animation">{player}'
                  f'<figcaption>{html.escape(caption)}</figcaption></figure>')
    return HTML(player)
