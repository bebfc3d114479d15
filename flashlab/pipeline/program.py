"""Engine programs: tasks collected per engine in program order under symbolic keys, and the
order the Cube runs its matmuls in (:func:`cube_order`)."""
from __future__ import annotations

from collections.abc import Hashable

from flashlab.pipeline.simulate import TaskGraph

__all__ = ["Program", "cube_order"]


class Program:
    """Tasks collected per engine in program order under symbolic keys; deps by key."""

    def __init__(self, engines: tuple[str, ...]):
        self.engines = engines
        self.queues: dict[str, list[Hashable]] = {e: [] for e in engines}
        self.spec: dict[Hashable, dict] = {}

    def add(self, key: Hashable, engine: str, name: str, duration: float, deps=(), *,
            acquire: str | None = None, releases=(), kind: str = "", step: int = -1) -> Hashable:
        if key in self.spec:
            raise RuntimeError(f"duplicate task key {key!r}")  # a bug in this module
        self.queues[engine].append(key)
        self.spec[key] = dict(engine=engine, name=name, duration=duration, deps=tuple(deps),
                              acquire=acquire, releases=tuple(releases), kind=kind, step=step)
        return key

    def depend(self, key: Hashable, *deps: Hashable) -> None:
        """Add dependencies to a task already added."""
        self.spec[key]["deps"] += deps

    def graph(self, pools: dict[str, int], info: dict) -> TaskGraph:
        g = TaskGraph(pools=pools, engines=tuple(e for e in self.engines if self.queues[e]),
                      info=info)
        index: dict[Hashable, int] = {}
        for e in self.engines:
            for key in self.queues[e]:
                index[key] = len(index)
        for e in self.engines:
            for key in self.queues[e]:
                s = self.spec[key]
                g.add(s["name"], s["engine"], s["duration"], [index[d] for d in s["deps"]],
                      acquire=s["acquire"], releases=[index[r] for r in s["releases"]],
                      kind=s["kind"], step=s["step"])
        return g


def cube_order(n_steps: int, lookahead: int) -> list[tuple[str, int]]:
    """The Cube's program order: ``("QK", t)`` and ``("PV", t)`` with the QK products
    ``lookahead`` steps ahead. ``lookahead=1``: QK0, QK1, PV0, QK2, PV1, ..., PV(n-1)."""
    order = []
    for t in range(n_steps):
        order.append(("QK", t))
        if t - lookahead >= 0:
            order.append(("PV", t - lookahead))
    order += [("PV", t) for t in range(max(0, n_steps - lookahead), n_steps)]
    return order
