r"""A discrete-event simulator of in-order engines that share buffer slots.

The model (the way an Ascend AI Core runs a kernel: every pipe -- MTE2, MTE1, Cube, FixPipe,
Vector, MTE3 -- has its own instruction queue, and the queues wait on each other through
set/wait flags):

- an **engine** runs its tasks one at a time, in **program order** (the order in which the
  tasks appear in ``TaskGraph.tasks``); a task never overtakes an earlier task of its engine;
- a task starts when its engine is free, every task it depends on has **ended**, and the
  **buffer slots** it acquires are free; it then runs for its ``duration``;
- a task may **acquire** slots of a pool (an L1 ping/pong buffer, an L0C accumulator) at its
  start; the slots are given back at the **end** of the task that **releases** them (usually a
  later task on another engine: the MTE2 copy fills a buffer, the Cube's last read frees it).
  Free slots are handed out first-in first-out, so two slots alternate: ping, pong, ping, ...

With these rules the start time of task $t$ on engine $e$ is

$$
s_t = \max\big(e_{\mathrm{prev}(t)},\ \max_{d \in \mathrm{deps}(t)} e_d,\ r_t\big), \qquad
e_t = s_t + \tau_t,
$$

where $\mathrm{prev}(t)$ is the task before $t$ on its engine and $r_t$ the time at which the
slot it needs is released. The simulator walks the completion events in time order (a heap),
and at each event starts every engine whose next task is ready: $O(N \log N)$ for $N$ tasks.

Two stages of durations $a$ (a copy into a buffer) and $b$ (a computation that frees it) over
$n$ tiles give exactly $n(a + b)$ with one buffer and $a + b + (n - 1)\max(a, b)$ with two:
the first tile pays both stages, every further tile only the slower one.

A configuration that can never finish -- a dependency cycle, a task that needs more slots
than its pool has, a pool of zero slots, or a deadlock between program order and slots --
raises ``ValueError`` (never hangs): the pools and indices are checked before the run, and a
run in which no task can start while none is running stops with a message that names the
cycle or each engine's blocked task.

The FlashAttention tile loop of one core is built as such a graph in
:mod:`flashlab.pipeline.schedule` (:func:`~flashlab.pipeline.schedule.simulate_fa`), which
imports this module and never the reverse.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from flashlab.arguments import as_int

#: The memory the pipeline model may use for one graph and its simulation, in bytes (2 GB). A
#: problem that would need more is refused up front by :func:`check_memory`, before anything of
#: its size is allocated (a 10**6-tile graph would otherwise fill the memory for minutes).
#: Raise it to model a bigger problem on a bigger machine.
MEMORY_BUDGET = 2 * 10**9
#: The bytes one task takes in a graph and its simulation (a :class:`Task` with its lists as
#: ``build_fa_graph`` makes them, measured with tracemalloc, rounded up).
BYTES_PER_TASK = 1000
#: The bytes one buffer slot of a pool takes while simulating (a deque entry and its int).
BYTES_PER_SLOT = 40


def check_memory(what: str, tasks: int, slots: int = 0) -> None:
    """Refuse (``ValueError``) a graph of ``tasks`` tasks and ``slots`` buffer slots whose
    model would need more than :data:`MEMORY_BUDGET` bytes; the message names the size."""
    # need = tasks * BYTES_PER_TASK + slots * BYTES_PER_SLOT  (Python ints: no overflow)
    need = tasks * BYTES_PER_TASK + slots * BYTES_PER_SLOT
    if need > MEMORY_BUDGET:
        raise ValueError(
            f"{what} would need about {need / 1e9:.3g} GB ({tasks} tasks, {slots} buffer slots), "
            f"more than the pipeline model's memory budget of {MEMORY_BUDGET / 1e9:.3g} GB "
            "(flashlab.pipeline.simulate.MEMORY_BUDGET): model a smaller problem (fewer or "
            "larger tiles, fewer slots) or raise the budget")

__all__ = ["Task", "TaskGraph", "Span", "SlotSpan", "SimResult", "simulate", "two_stage_graph",
           "TIME_UNITS", "MEMORY_BUDGET", "BYTES_PER_TASK", "BYTES_PER_SLOT", "check_memory"]

#: seconds -> the unit the drawings label their time axes in
TIME_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


class Task:
    """One unit of work on one engine.

    Attributes
    ----------
    name
        a short label (``"K3"``, ``"QK3.1"``)
    engine
        the engine that runs it
    duration
        seconds (>= 0)
    deps
        indices of the tasks that must end before it starts
    acquire
        the pool it takes ``slots`` slots of at its start (or ``None``)
    releases
        indices of tasks whose acquired slots it gives back at its end (each such
        task becomes an implicit dependency)
    kind
        a colour key for drawings (:data:`flashlab.viz.gantt.KIND_COLORS`)
    step
        the tile step it belongs to (-1 if none)
    """

    __slots__ = ("name", "engine", "duration", "deps", "acquire", "slots", "releases", "kind", "step")

    def __init__(self, name: str, engine: str, duration: float, deps: Sequence[int] = (),
                 acquire: str | None = None, slots: int = 1, releases: Sequence[int] = (),
                 kind: str = "", step: int = -1):
        self.name = name
        self.engine = engine
        self.duration = float(duration)
        self.deps = tuple(deps)
        self.acquire = acquire
        self.slots = slots
        self.releases = tuple(releases)
        self.kind = kind
        self.step = step

    def __repr__(self) -> str:
        extra = f", acquire={self.acquire!r}x{self.slots}" if self.acquire else ""
        extra += f", releases={self.releases}" if self.releases else ""
        return (f"Task({self.name!r}, {self.engine!r}, {self.duration:.3g}, "
                f"deps={self.deps}{extra})")


@dataclass
class TaskGraph:
    """Tasks in program order, the pools of buffer slots, and the engines (lane order).

    Attributes
    ----------
    tasks
        every :class:`Task`; an engine's program order is the order of its tasks here
    pools
        slots per pool name, e.g. ``{"L1.B": 2, "L1.A": 2}``
    engines
        engine names in the order they are drawn (engines of tasks not listed are
        appended)
    info
        a free-form description of what the graph models (shapes, bytes, strategy)
    """

    tasks: list[Task] = field(default_factory=list)
    pools: dict[str, int] = field(default_factory=dict)
    engines: tuple[str, ...] = ()
    info: dict = field(default_factory=dict)

    def add(self, name: str, engine: str, duration: float, deps: Sequence[int] = (), *,
            acquire: str | None = None, slots: int = 1, releases: Sequence[int] = (),
            kind: str = "", step: int = -1) -> int:
        """Append a task (last in its engine's program order) and return its index."""
        self.tasks.append(Task(name, engine, duration, deps, acquire, slots, releases, kind, step))
        return len(self.tasks) - 1

    def engine_order(self) -> tuple[str, ...]:
        """``engines`` followed by any other engine that has tasks, in order of appearance."""
        seen = list(self.engines)
        for t in self.tasks:
            if t.engine not in seen:
                seen.append(t.engine)
        return tuple(seen)


class Span(NamedTuple):
    """One task on the timeline: ``engine`` ran ``task`` from ``start`` to ``end`` (seconds)."""

    engine: str
    task: str
    start: float
    end: float
    kind: str
    step: int


class SlotSpan(NamedTuple):
    """Slot ``slot`` of ``pool`` held from ``start`` to ``end`` for the data ``task`` brought in."""

    pool: str
    slot: int
    start: float
    end: float
    task: str
    step: int


@dataclass
class SimResult:
    """What a simulation returns.

    Attributes
    ----------
    graph
        the simulated :class:`TaskGraph`
    start
        the start of each task, in seconds (same indices as ``graph.tasks``)
    end
        the end of each task, in seconds
    slot_of
        the slot indices each task acquired
    makespan
        the end of the last task, in seconds
    busy
        seconds each engine worked
    utilization
        busy / makespan per engine
    critical_engine
        the engine with the highest utilization (the bottleneck that a perfect
        overlap would expose)
    idle_gaps
        the intervals of ``[0, makespan]`` during which the critical engine was idle
    """

    graph: TaskGraph
    start: list[float]
    end: list[float]
    slot_of: list[tuple[int, ...]]
    makespan: float
    busy: dict[str, float]
    utilization: dict[str, float]
    critical_engine: str
    idle_gaps: list[tuple[float, float]]

    @property
    def engines(self) -> tuple[str, ...]:
        """Engine names in lane order."""
        return tuple(self.busy)

    @property
    def timeline(self) -> list[Span]:
        """Every task as a :class:`Span` ``(engine, task, start, end, kind, step)``, in task order."""
        return [Span(t.engine, t.name, s, e, t.kind, t.step)
                for t, s, e in zip(self.graph.tasks, self.start, self.end)]

    @property
    def occupancy(self) -> list[SlotSpan]:
        """Every holding of a slot as a :class:`SlotSpan`, from the start of the acquiring task
        to the end of the task that releases it (the makespan if none does)."""
        tasks = self.graph.tasks
        freed = {}
        for i, t in enumerate(tasks):
            for a in t.releases:
                freed[a] = self.end[i]
        spans = []
        for i, slots in enumerate(self.slot_of):
            for s in slots:
                # a task holds slots only of the pool it acquires from (acquire is set)
                spans.append(SlotSpan(cast(str, tasks[i].acquire), s, self.start[i], freed.get(i, self.makespan),
                                      tasks[i].name, tasks[i].step))
        return spans

    def spans(self, engine: str) -> list[Span]:
        """The tasks of ``engine`` in program order."""
        return [s for s in self.timeline if s.engine == engine]

    def gaps(self, engine: str, min_length: float = 0.0) -> list[tuple[float, float]]:
        """Intervals of ``[0, makespan]`` longer than ``min_length`` in which ``engine`` is idle."""
        if engine not in self.busy:
            raise ValueError(f"engine must be one of {self.engines}; got {engine!r}")
        out, t = [], 0.0
        for s, e in sorted((self.start[i], self.end[i]) for i, task in enumerate(self.graph.tasks)
                           if task.engine == engine):
            if s - t > min_length:
                out.append((t, s))
            t = max(t, e)
        if self.makespan - t > min_length:
            out.append((t, self.makespan))
        return out


# ------------------------------------------------------------------------------- validation
def _validate(graph: TaskGraph) -> None:
    """Raise ValueError for anything that could never run: bad indices, missing or empty
    pools, a task needing more slots than its pool has, double releases, cycles."""
    if not isinstance(graph, TaskGraph):
        raise TypeError(f"graph must be a TaskGraph; got {type(graph).__name__}")
    tasks, n = graph.tasks, len(graph.tasks)
    for name, size in graph.pools.items():
        # a pool of zero buffers can never hold a tile
        as_int(f"pool {name!r}'s slot count", size, lo=1, what="an int >= 1")
    # the simulator holds a queue entry per slot: refused before it builds them
    check_memory("simulating this graph", n, sum(int(k) for k in graph.pools.values()))
    released_by: dict[int, int] = {}
    for i, t in enumerate(tasks):
        if not (t.duration >= 0.0) or t.duration == float("inf"):
            raise ValueError(f"task {i} ({t.name}) must have a finite duration >= 0; got {t.duration}")
        for d in t.deps:
            if not isinstance(d, int) or not 0 <= d < n or d == i:
                raise ValueError(f"task {i} ({t.name}) has a bad dependency {d!r}: expected another "
                                 f"task index in [0, {n})")
        if t.acquire is not None:
            if t.acquire not in graph.pools:
                raise ValueError(f"task {i} ({t.name}) acquires from unknown pool {t.acquire!r}; "
                                 f"pools: {sorted(graph.pools)}")
            as_int(f"task {i} ({t.name})'s slots", t.slots, lo=1, what="an int >= 1")
            if t.slots > graph.pools[t.acquire]:
                raise ValueError(f"task {i} ({t.name}) needs {t.slots} slots of pool {t.acquire!r}, "
                                 f"which has only {graph.pools[t.acquire]}")
        for a in t.releases:
            if not isinstance(a, int) or not 0 <= a < n or a == i or tasks[a].acquire is None:
                raise ValueError(f"task {i} ({t.name}) releases {a!r}, which is not another task "
                                 "that acquires slots")
            if a in released_by:
                raise ValueError(f"the slots of task {a} ({tasks[a].name}) are released twice: "
                                 f"by tasks {released_by[a]} and {i}")
            released_by[a] = i


def _check_acyclic(graph: TaskGraph) -> None:
    """Kahn's algorithm over dependencies, release -> acquirer edges and program order."""
    tasks = graph.tasks
    n = len(tasks)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    last: dict[str, int] = {}
    for i, t in enumerate(tasks):
        preds = set(t.deps) | set(t.releases)
        if t.engine in last:
            preds.add(last[t.engine])
        last[t.engine] = i
        for p in preds:
            succ[p].append(i)
        indeg[i] = len(preds)
    ready = [i for i in range(n) if indeg[i] == 0]
    seen = 0
    while ready:
        i = ready.pop()
        seen += 1
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if seen < n:
        stuck = [tasks[i].name for i in range(n) if indeg[i] > 0][:8]
        raise ValueError(f"dependency cycle (dependencies plus each engine's program order): "
                         f"{n - seen} tasks can never start, e.g. {stuck}")


# -------------------------------------------------------------------------------- simulation
def simulate(graph: TaskGraph) -> SimResult:
    """Run ``graph`` and return its timeline and metrics (see the module docstring).

    Deterministic: ties are broken by engine order and by the order tasks started.
    Raises ValueError if the graph can never finish.
    """
    _validate(graph)
    tasks = graph.tasks
    n = len(tasks)
    engines = graph.engine_order()
    queues: dict[str, list[int]] = {e: [] for e in engines}
    for i, t in enumerate(tasks):
        queues[t.engine].append(i)
    order = [e for e in engines if queues[e]]

    # remaining[i]: unfinished tasks that i waits for (its deps and the tasks whose slots it frees)
    succ: list[list[int]] = [[] for _ in range(n)]
    remaining = [0] * n
    for i, t in enumerate(tasks):
        preds = set(t.deps) | set(t.releases)
        remaining[i] = len(preds)
        for p in preds:
            succ[p].append(i)

    free = {p: deque(range(k)) for p, k in graph.pools.items()}
    start = [0.0] * n
    end = [0.0] * n
    slot_of: list[tuple[int, ...]] = [()] * n
    head = dict.fromkeys(order, 0)
    busy_engine = dict.fromkeys(order, False)
    events: list[tuple[float, int, int]] = []
    seq = 0
    now = 0.0
    finished = 0
    while finished < n:
        # start every engine whose next task is ready at `now` (starting a task frees nothing,
        # so one pass over the engines is enough until the next completion)
        for e in order:
            if busy_engine[e]:
                continue
            q = queues[e]
            h = head[e]
            if h == len(q):
                continue
            i = q[h]
            if remaining[i]:
                continue
            t = tasks[i]
            if t.acquire is not None:
                pool = free[t.acquire]
                if len(pool) < t.slots:
                    continue
                slot_of[i] = ((pool.popleft(),) if t.slots == 1
                              else tuple(pool.popleft() for _ in range(t.slots)))
            start[i] = now
            # e_t = s_t + tau_t
            end[i] = now + t.duration
            head[e] = h + 1
            busy_engine[e] = True
            heapq.heappush(events, (end[i], seq, i))
            seq += 1
        if not events:
            _check_acyclic(graph)  # a clearer message if the cause is a cycle
            raise ValueError(_deadlock_message(graph, queues, head, remaining, free))
        # complete every task that ends at the earliest event time
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, i = heapq.heappop(events)
            t = tasks[i]
            busy_engine[t.engine] = False
            finished += 1
            for a in t.releases:
                free[cast(str, tasks[a].acquire)].extend(slot_of[a])
            for j in succ[i]:
                remaining[j] -= 1

    makespan = max(end, default=0.0)
    busy = {e: 0.0 for e in engines}
    for t in tasks:
        busy[t.engine] += t.duration
    utilization = {e: (b / makespan if makespan > 0 else 0.0) for e, b in busy.items()}
    critical = max(engines, key=lambda e: utilization[e]) if engines else ""
    result = SimResult(graph, start, end, slot_of, makespan, busy, utilization, critical, [])
    if critical:
        result.idle_gaps = result.gaps(critical)
    return result


def _deadlock_message(graph, queues, head, remaining, free) -> str:
    tasks = graph.tasks
    lines = []
    for e, q in queues.items():
        if head.get(e, len(q)) >= len(q):
            continue
        t = tasks[q[head[e]]]
        if remaining[q[head[e]]]:
            why = "waits for unfinished tasks"
        else:
            why = (f"needs {t.slots} slot(s) of pool {t.acquire!r}, "
                   f"{len(free[t.acquire])} free of {graph.pools[t.acquire]}")
        lines.append(f"{e}: next task {t.name} {why}")
    return ("deadlock: no task can start and none is running (program order and buffer slots "
            "wait on each other): " + "; ".join(lines))


def two_stage_graph(a: float, b: float, n: int, buffers: int) -> TaskGraph:
    """The textbook pipeline: ``n`` tiles, each copied in by ``COPY`` (``a`` s) into one of
    ``buffers`` slots and consumed by ``COMPUTE`` (``b`` s), which frees the slot."""
    check_memory(f"two_stage_graph(n={n}, buffers={buffers})", 2 * as_int("n", n, lo=0),
                 as_int("buffers", buffers, lo=1))
    g = TaskGraph(pools={"buf": buffers}, engines=("COPY", "COMPUTE"))
    for j in range(n):
        c = g.add(f"copy{j}", "COPY", a, acquire="buf", kind="copy", step=j)
        g.add(f"compute{j}", "COMPUTE", b, [c], releases=[c], kind="compute", step=j)
    return g
