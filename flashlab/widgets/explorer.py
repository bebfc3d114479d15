"""One explorer, live and static: precomputed states drawn by a small JavaScript renderer.

An explorer is a set of controls and a function from their values to a *state*: the rectangles,
marks and printed numbers of one picture, computed by the package's own code (the walk, the
pipeline schedule, the CANN planner, the cost model). The JavaScript renderer
(``explorer.js`` beside this module) only draws a state: it never recomputes one.

- **Static page** (:meth:`Explorer.static_html`, the ``text/html`` of the explorer's output):
  every state of the explorer's *grid* (each control's ``grid`` values, every
  combination) is computed at build time, deduplicated and embedded as gzip-compressed JSON;
  the page's controls offer exactly the grid's values and look a state up on each change.
- **Live kernel** (:meth:`Explorer.live_widget`, the ipywidgets view of the same object): the
  controls reach any value (each control's ``live`` range); each change recomputes that one state in
  Python and shows it with the same renderer.

Displaying an explorer gives both representations; a Jupyter front-end with a widget manager
shows the live one, the HTML book (``nb_mime_priority_overrides`` in ``_config.yml`` puts
``text/html`` first) the static one. The state's JSON holds integers and rounded numbers only,
so it is the same under any BLAS and on any machine.

A state is a dict with ``"text"`` (the lines printed under the picture), optionally ``"off"``
(the controls that do not matter for it: the page disables them) and ``"frames"`` (a list of
dicts with their own ``"text"``: the page adds a step slider with play, previous and next).
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import html
import itertools
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, ClassVar

__all__ = ["Control", "Explorer", "EXPLORERS", "REPOSITORY", "BRANCH", "LAUNCH_PATH",
           "BINDER_URL", "COLAB_URL", "STATIC_NOTE", "launch_links", "renderer_js",
           "MAX_PAYLOAD_BYTES"]

#: the repository the launch links open (must agree with ``_config.yml``'s repository:
#: ``tests/test_launch.py`` checks it)
REPOSITORY = "flashlab-book/flashlab"
#: its branch
BRANCH = "main"
#: the folder of the launched notebooks (``_config.yml``'s ``path_to_book``: the handout)
LAUNCH_PATH = "handout"
#: the BinderHub the book's launch buttons use
BINDER_URL = "https://mybinder.org"
#: the Colab the book's launch buttons use
COLAB_URL = "https://colab.research.google.com"
#: the caption of every static explorer
STATIC_NOTE = "static page: precomputed values; open the notebook for any value"
#: the most bytes one explorer may add to its page, 2 MB (issue 33)
MAX_PAYLOAD_BYTES = 2_000_000

#: every explorer class by its ``kind`` (each subclass with a ``kind`` registers itself)
EXPLORERS: dict[str, type[Explorer]] = {}


def launch_links(notebook: str) -> dict[str, str]:
    """The Binder and Colab URLs that open ``book/<notebook>.ipynb``'s handout, as the book's
    launch buttons do: ``{"Binder": ..., "Colab": ...}``."""
    path = f"{LAUNCH_PATH}/book/{notebook}.ipynb"
    return {"Binder": f"{BINDER_URL}/v2/gh/{REPOSITORY}/{BRANCH}?urlpath=lab/tree/{path}",
            "Colab": f"{COLAB_URL}/github/{REPOSITORY}/blob/{BRANCH}/{path}"}


def renderer_js() -> str:
    """The JavaScript renderer of every explorer (``flashlab/widgets/explorer.js``)."""
    return resources.files("flashlab.widgets").joinpath("explorer.js").read_text(encoding="utf-8")


@dataclass(frozen=True)
class Control:
    """One control of an explorer.

    ``name`` is the keyword of the explorer's constructor, ``label`` what the page shows,
    ``grid`` the values the static page offers (in order), ``live`` how the live control is
    built: ``{"min": a, "max": b}`` for an integer slider, ``{"step": s, "min": a, "max": b}``
    for a float slider, ``{"options": (...)}`` for a dropdown over more values than the grid's,
    or ``{}`` for a dropdown over ``grid``. A control whose grid has one value is not shown in
    the static page (it is fixed there).
    """

    name: str
    label: str
    grid: tuple
    live: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.grid:
            raise ValueError(f"control {self.name!r}: grid must offer at least one value")
        if len(set(self.grid)) != len(self.grid):
            raise ValueError(f"control {self.name!r}: grid values must be distinct; got {self.grid}")


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


class Explorer:
    """Base class of the explorers: controls, the grid of states, the static and live views.

    A subclass sets ``kind`` (the renderer's name in ``explorer.js``), ``controls`` (a tuple
    of :class:`Control`), ``title`` and ``notebook`` (the chapter whose launch links the static
    caption gives), and implements :meth:`state`. Construct it with control values as keywords
    (any value the live control accepts; the defaults are the first of each grid unless
    ``defaults`` says otherwise).
    """

    kind: ClassVar[str] = ""
    controls: ClassVar[tuple[Control, ...]] = ()
    defaults: ClassVar[dict[str, Any]] = {}
    title: ClassVar[str] = ""
    notebook: ClassVar[str] = ""
    #: milliseconds between two frames when the page plays a state's frames
    interval: ClassVar[int] = 600

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.kind:
            EXPLORERS[cls.kind] = cls

    def __init__(self, **values: Any) -> None:
        names = [c.name for c in self.controls]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown control(s) {unknown}; "
                            f"its controls are {names}")
        self.values: dict[str, Any] = {c.name: self.defaults.get(c.name, c.grid[0])
                                       for c in self.controls}
        self.values.update(values)
        self._payload: dict | None = None
        self._widget = None
        self.pool: list = []
        self._pool_index: dict[str, int] = {}
        self.state(self.values)          # validates the values (raises ValueError/TypeError)

    # ---------------------------------------------------------------- the model side
    def state(self, values: dict[str, Any]) -> dict:
        """The state the renderer draws for ``values`` (a dict over every control)."""
        raise NotImplementedError

    def relevant(self, values: dict[str, Any]) -> dict[str, Any]:
        """The values that decide the state (default: all): the grid computes one state per
        distinct result, so a subclass drops the controls a state ignores (those in its
        ``"off"`` list) to skip recomputing it."""
        return values

    def pooled(self, obj: Any) -> int:
        """Put ``obj`` (JSON-able) in the payload's shared pool once; return its index. States
        refer to large shared parts (a mask drawn by many states) by this index."""
        key = _compact(obj)
        if key not in self._pool_index:
            self._pool_index[key] = len(self.pool)
            self.pool.append(obj)
        return self._pool_index[key]

    def numbers(self, values: dict[str, Any] | None = None, frame: int = 0) -> list[str]:
        """The lines printed under the picture for ``values`` (default: the explorer's own) and
        step ``frame`` of a state with frames: what the page shows in that state."""
        st = self.state({**self.values, **(values or {})})
        lines = list(st["text"])
        if "frames" in st:
            lines += st["frames"][frame]["text"]
        return lines

    def grid_values(self):
        """Every combination of the controls' grid values, in the page's lookup order (the last
        control varies fastest)."""
        for combo in itertools.product(*(c.grid for c in self.controls)):
            yield dict(zip((c.name for c in self.controls), combo))

    def payload(self) -> dict:
        """The static page's data: the controls, one state per distinct picture, the lookup
        from every grid combination (mixed-radix index, last control fastest) to its state, and
        the shared pool. Computed once per explorer."""
        if self._payload is None:
            self.pool, self._pool_index = [], {}
            states: list[dict] = []
            seen: dict[str, int] = {}
            lookup = []
            done: dict[str, int] = {}
            for values in self.grid_values():
                rel = _compact(self.relevant(values))
                if rel not in done:
                    st = self.state(values)
                    key = _compact(st)
                    if key not in seen:
                        seen[key] = len(states)
                        states.append(st)
                    done[rel] = seen[key]
                lookup.append(done[rel])
            init = [self._grid_index(c) for c in self.controls]
            self._payload = {
                "kind": self.kind, "interval": self.interval,
                "controls": [{"name": c.name, "label": c.label, "values": list(c.grid)}
                             for c in self.controls],
                # a copy: a later state() (numbers(), the live view) must not grow the page's pool
                "init": init, "lookup": lookup, "states": states, "pool": list(self.pool)}
        return self._payload

    def inert_controls(self) -> list[str]:
        """The controls the static page shows (grid of 2 or more values) that change no state:
        no two grid combinations that differ in that control alone map to different states.
        An explorer with one is broken (a control that does nothing)."""
        payload = self.payload()
        sizes = [len(c.grid) for c in self.controls]
        lookup = payload["lookup"]
        inert = []
        for n, c in enumerate(self.controls):
            if sizes[n] < 2:
                continue
            stride = 1
            for size in sizes[n + 1:]:
                stride *= size
            # index = sum idx_m * stride_m: moving control n by one value adds stride
            moves = any(lookup[k] != lookup[k + stride] for k in range(len(lookup))
                        if (k // stride) % sizes[n] < sizes[n] - 1)
            if not moves:
                inert.append(c.name)
        return inert

    def _grid_index(self, c: Control) -> int:
        value = self.values[c.name]
        return c.grid.index(value) if value in c.grid else 0

    # ---------------------------------------------------------------------- the views
    def _html(self, payload: dict, *, static: bool) -> str:
        raw = _compact(payload).encode("utf-8")
        # mtime=0: the same bytes on every build (nbval compares the stored output)
        data = base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")
        uid = "fx-" + hashlib.sha1(data.encode("ascii")).hexdigest()[:12]
        args = html.escape(_compact(self.values), quote=True)
        if static:
            links = " ".join(f'<a href="{html.escape(u)}">{name}</a>'
                             for name, u in launch_links(self.notebook).items())
            caption = f"{STATIC_NOTE} ({links})."
        else:
            caption = "live kernel: every change is recomputed in Python."
        return (f'<div class="flashlab-explorer" id="{uid}" data-explorer="{self.kind}" '
                f'data-args="{args}" data-static="{int(static)}">'
                f'<div class="fx-title">{html.escape(self.title)}</div>'
                '<div class="fx-controls"></div><div class="fx-picture"></div>'
                '<div class="fx-numbers" aria-live="polite"></div>'
                f'<div class="fx-caption">{caption}</div>'
                '<noscript>This explorer needs JavaScript.</noscript>'
                f'<script type="application/octet-stream" class="fx-data">{data}</script>'
                f'<script>{renderer_js()}\nwindow.flashlabExplorer.boot("{uid}");</script>'
                '</div>')

    def static_html(self) -> str:
        """The static explorer: every grid state, the page's own controls, the caption with the
        launch links. Raises ``ValueError`` if it would add more than
        :data:`MAX_PAYLOAD_BYTES` to the page."""
        out = self._html(self.payload(), static=True)
        if len(out.encode("utf-8")) > MAX_PAYLOAD_BYTES:
            raise ValueError(f"{type(self).__name__}: the static explorer is "
                             f"{len(out.encode()):,} bytes, over {MAX_PAYLOAD_BYTES:,}: shrink its grid")
        return out

    def single_html(self, values: dict[str, Any] | None = None) -> str:
        """One state (``values`` over the explorer's own), drawn by the same renderer with no
        controls but the step slider: what the live view shows after each change."""
        values = {**self.values, **(values or {})}
        self.pool, self._pool_index = [], {}
        st = self.state(values)
        payload = {"kind": self.kind, "interval": self.interval, "controls": [], "init": [],
                   "lookup": [0], "states": [st], "pool": self.pool}
        self._payload = None
        return self._html(payload, static=False)

    def live_widget(self):
        """The ipywidgets view (needs ipywidgets): a control per ``controls``, reaching any
        value of its ``live`` range, and an ``Output`` with the recomputed state."""
        if self._widget is not None:
            return self._widget
        import ipywidgets as W

        self.widgets: dict[str, Any] = {}
        style = {"description_width": "initial"}
        for c in self.controls:
            value = self.values[c.name]
            spec = c.live
            if "step" in spec:
                w = W.FloatSlider(value, min=spec["min"], max=spec["max"], step=spec["step"],
                                  description=c.label, continuous_update=False, style=style)
            elif "min" in spec:
                w = W.IntSlider(value, min=spec["min"], max=spec["max"], description=c.label,
                                continuous_update=False, style=style)
            else:
                options = tuple(spec.get("options", c.grid))
                options = options if value in options else (*options, value)
                w = W.Dropdown(options=options, value=value, description=c.label, style=style)
            w.observe(lambda _: self._live_update(), names="value")
            self.widgets[c.name] = w
        self.error = W.HTML()
        self.out = W.Output()
        self._widget = W.VBox([W.HBox(list(self.widgets.values()),
                                      layout=W.Layout(flex_flow="row wrap")),
                               self.error, self.out])
        self._live_update()
        return self._widget

    def _live_update(self) -> None:
        values = {name: w.value for name, w in self.widgets.items()}
        try:
            shown = self.single_html(values)
        except (ValueError, TypeError) as exc:
            self.error.value = f"<b>Cannot show this:</b> <code>{html.escape(str(exc))}</code>"
            return
        self.values = values
        self.error.value = ""
        self.out.outputs = ({"output_type": "display_data", "metadata": {},
                             "data": {"text/html": shown,
                                      "text/plain": f"<{type(self).__name__} {values}>"}},)

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {"text/plain": f"<{type(self).__name__}: {len(self.payload()['states'])} "
                                f"precomputed states>",
                  "text/html": self.static_html()}
        try:
            bundle = {**self.live_widget()._repr_mimebundle_(), **bundle}
        except ImportError:      # no ipywidgets: the static explorer only
            pass
        return bundle
