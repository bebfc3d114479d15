"""The package's import graph: two stacks joined above them, no cycles, no import running back up.

Every module's imports are read with ``ast`` -- at module level and inside functions alike (and
under ``if TYPE_CHECKING``), so an import hidden in a function body to dodge a cycle is still
an edge.

The package is a DAG of tiers (the picture is in the README of the design, two columns joined
by the model and teaching layers):

- ``base``: pure-Python helpers every module may use (argument checks, tile arithmetic, the
  operator names) and, above them, the closed-form cost models: the MLA step ledgers, the
  traffic model (with the one ``Traffic`` type the CUDA twin's counters also return) and the
  FLOP counts;
- two columns side by side, neither importing the other: ``attention`` (masks, validation,
  reference, the Numba kernels and, on their floor, the CUDA twin ``gpu/``, the API and its
  front doors) and ``hardware`` (the pure-Python AI Core model, no Numba);
- ``model``: the MLA and RECT-FA models, which join the two columns;
- ``teaching``: drawings, walks, explorers, exercise checkers and the benchmark.

Within a tier (and within a column) the layers are listed bottom first; a module may import
modules of its own layer or below, and modules of any lower tier.

Every package is ordered inside as well (:data:`PACKAGES`): its modules on floors, bottom first,
every module of the package named, its ``__init__`` (the package's face) on the top floor; a
module imports modules of its own package from its floor or below only. A new module, or a new
package, fails :func:`test_every_package_puts_each_module_on_a_floor` until it is given a floor.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flashlab"

#: tier -> column -> layers, bottom first; a module belongs to the layer with the longest prefix
#: matching its name. Tiers are listed bottom first; the two columns of the middle tier share it
TIERS: dict[str, dict[str, list[tuple[str, ...]]]] = {
    "base": {"base": [
        ("flashlab._lazy", "flashlab.data", "flashlab.arguments", "flashlab.tiling", "flashlab.dataflows",
         "flashlab.memory", "flashlab.viz.code", "flashlab.paired"),
        # the closed-form cost models, one idea each: step ledgers, traffic (the Traffic type
        # lives here, below the CUDA twin that returns it), FLOP counts and intensities
        ("flashlab.ledgers",),
        ("flashlab.traffic",),
        ("flashlab.flops",),
    ]},
    "stacks": {
        "attention": [
            ("flashlab.numba_cache",),
            ("flashlab.input_scan", "flashlab.dropout", "flashlab.masks", "flashlab.rope"),
            # the kernels' options record (plain data and each option's rule): the checked
            # Problem holds its scores stage, so it sits below validation, away from its package
            ("flashlab.kernels.options",),
            ("flashlab.validation",),
            ("flashlab.reference",),
            # the CUDA twin beside the CPU kernels: it checks with validation, as the API does,
            # and imports nothing above
            ("flashlab.kernels", "flashlab.gpu"),
            ("flashlab.api",),
            ("flashlab.cann", "flashlab.compat"),
            ("flashlab.__init__", "flashlab.torch_attention"),
        ],
        "hardware": [
            ("flashlab.pipeline.params",),
            ("flashlab.pipeline.roofline",),
            ("flashlab.pipeline.profiles",),
            ("flashlab.pipeline.calibrated",),
            ("flashlab.pipeline.simulate",),
            ("flashlab.pipeline.buffers", "flashlab.pipeline.program", "flashlab.pipeline.durations"),
            ("flashlab.pipeline.graph_builder",),
            ("flashlab.pipeline.loads",),
            ("flashlab.pipeline.schedule",),
            ("flashlab.pipeline.core_fit",),
            ("flashlab.pipeline.timing", "flashlab.pipeline.settings", "flashlab.pipeline.__init__"),
        ],
    },
    "model": {"model": [
        ("flashlab.mla",),
        ("flashlab.rect", "flashlab.vendor"),
    ]},
    "teaching": {"teaching": [
        ("flashlab.viz",),
        ("flashlab.walk", "flashlab.replay", "flashlab.exercises"),
        ("flashlab.widgets.explorer",),
        ("flashlab.widgets.tiles", "flashlab.widgets.pipeline", "flashlab.widgets.sparse",
         "flashlab.widgets.roofline"),
        ("flashlab.widgets.__init__",),
        ("flashlab.bench", "flashlab.gpu.bench"),
    ]},
}

#: package -> its modules (the last part of their names) on floors, bottom first. The hardware
#: column lists the modules of ``flashlab.pipeline`` one by one, so its floors are read from there.
PACKAGES: dict[str, list[tuple[str, ...]]] = {
    "flashlab.data": [("__init__",)],
    "flashlab.kernels": [("intrinsics", "blas", "options", "rowstep", "scorestep"), ("tile",),
                         ("forward", "backward", "decode"), ("__init__",)],
    "flashlab.gpu": [("target",), ("tiles", "traffic"), ("forward", "backward", "standard"), ("inspect",),
                     ("attention",), ("__init__", "bench")],
    "flashlab.cann": [("attributes", "sparse_modes"), ("layouts",), ("varlen",), ("plan",), ("pse",),
                      ("operator",), ("__init__",)],
    "flashlab.pipeline": [tuple(name.rsplit(".", 1)[1] for name in layer)
                          for layer in TIERS["stacks"]["hardware"]],
    "flashlab.viz": [("code", "style"),
                     ("backward", "gantt", "hierarchy", "mla", "performance", "roofline", "rope", "sparse_modes",
                      "tiles"),
                     ("masks",), ("__init__",)],
    "flashlab.exercises": [("_core",), ("_capstone", "_variants", "foundations", "gpu", "rect"), ("grading",),
                           ("__init__",)],
    "flashlab.widgets": [("explorer",), ("tiles", "pipeline", "sparse", "roofline"), ("__init__",)],
    "flashlab.bench": [("config", "overhead"), ("inputs", "estimates"), ("runners",), ("decode", "measure"),
                       ("report", "targets"), ("explorers",), ("suite",), ("ceiling",), ("cli", "_page"),
                       ("__init__", "__main__")],
}

#: edges tolerated against the rules, each with its reason (none today)
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def place_of(name: str) -> tuple[int, str, int]:
    """``(tier index, column, layer index)`` of a module: the layer with the longest prefix of its
    name (``flashlab.gpu.bench`` is a benchmark tool, not part of ``flashlab.gpu``'s layer);
    ``LookupError`` if it has none."""
    best: tuple[int, tuple[int, str, int]] | None = None
    for t, columns in enumerate(TIERS.values()):
        for column, layers in columns.items():
            for i, layer in enumerate(layers):
                for prefix in layer:
                    if (name == prefix or name.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                        best = (len(prefix), (t, column, i))
    if best is None:
        raise LookupError(name)
    return best[1]


def may_import(importer: str, imported: str) -> bool:
    """A lower tier, or the same column at the same or a lower layer."""
    (t, column, i), (u, other, j) = place_of(importer), place_of(imported)
    return u < t or (u == t and other == column and j <= i)


def floor_of(name: str) -> tuple[str, int] | None:
    """``(package, floor index)`` of a module inside its package (:data:`PACKAGES`); ``None`` for
    a top-level module; ``LookupError`` for a module of a package that has no floor for it."""
    package, _, short = name.rpartition(".")
    if package == "flashlab":
        return None
    if package not in PACKAGES:
        raise LookupError(f"{name}: package {package} is missing from PACKAGES")
    for i, floor in enumerate(PACKAGES[package]):
        if short in floor:
            return package, i
    raise LookupError(f"{name}: no floor in PACKAGES[{package!r}]")


def may_import_within(importer: str, imported: str) -> bool:
    """Inside one package: the imported module's floor is the importer's or below. Modules of
    different packages are judged by :func:`may_import` alone (always true here)."""
    mine, theirs = floor_of(importer), floor_of(imported)
    if mine is None or theirs is None or mine[0] != theirs[0]:
        return True
    return theirs[1] <= mine[1]


def packages() -> dict[str, set[str]]:
    """Every package of flashlab below the top one -> the last parts of its modules' names."""
    out: dict[str, set[str]] = {}
    for init in PACKAGE.rglob("__init__.py"):
        if init.parent != PACKAGE:
            out[module_name(init).rsplit(".", 1)[0]] = {p.stem for p in init.parent.glob("*.py")}
    return out


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every flashlab module ``path`` imports, anywhere in the file (``from X import y`` gives
    ``X.y`` when that is a module, else ``X``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    package = me.rsplit(".", 1)[0] if not path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            names = [f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base
                     for a in node.names]
        else:
            continue
        out.update(n for n in names if n == "flashlab" or n.startswith("flashlab."))
    out.discard(me)
    return {resolve(n) for n in out}


def is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def resolve(name: str) -> str:
    """A package name stands for its ``__init__``."""
    p = ROOT.joinpath(*name.split("."))
    return f"{name}.__init__" if (p / "__init__.py").exists() else name


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        graph[name] = imports_of(path)
    return graph


def test_every_module_has_a_layer():
    missing = [m for m in import_graph() if not _has_layer(m)]
    assert not missing, f"modules missing from TIERS: {missing}"


def _has_layer(name: str) -> bool:
    try:
        place_of(name)
    except LookupError:
        return False
    return True


def _tolerated(mod: str, dep: str) -> bool:
    return any(mod == a and dep.startswith(b) for a, b in ALLOWED_UPWARD)


def test_no_upward_import():
    bad = [f"{mod} {place_of(mod)} -> {dep} {place_of(dep)}"
           for mod, deps in import_graph().items() for dep in deps
           if not may_import(mod, dep) and not _tolerated(mod, dep)]
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


def test_every_package_puts_each_module_on_a_floor():
    found = packages()
    assert set(found) == set(PACKAGES), "packages without floors, or floors of a package that is gone"
    for package, modules in found.items():
        named = [m for floor in PACKAGES[package] for m in floor]
        assert sorted(named) == sorted(modules), f"{package}: floors {sorted(named)} != modules {sorted(modules)}"
        assert "__init__" in PACKAGES[package][-1], f"{package}: the face (__init__) belongs on the top floor"


def test_no_import_climbs_a_floor_inside_a_package():
    bad = [f"{mod} {floor_of(mod)} -> {dep} {floor_of(dep)}"
           for mod, deps in import_graph().items() for dep in deps if not may_import_within(mod, dep)]
    assert not bad, "imports climbing a package's floors:\n" + "\n".join(sorted(bad))


def test_the_two_stacks_do_not_import_each_other():
    crossing = [f"{mod} -> {dep}" for mod, deps in import_graph().items() for dep in deps
                if {place_of(mod)[1], place_of(dep)[1]} == {"attention", "hardware"}]
    assert not crossing, "\n".join(sorted(crossing))


def test_the_rules_catch_a_crossing_and_an_upward_edge():
    assert not may_import("flashlab.pipeline.schedule", "flashlab.validation")
    assert not may_import("flashlab.masks", "flashlab.pipeline.params")
    assert not may_import("flashlab.kernels.forward", "flashlab.api")
    assert not may_import("flashlab.pipeline.params", "flashlab.mla")
    assert not may_import("flashlab.ledgers", "flashlab.traffic")
    assert may_import("flashlab.gpu.traffic", "flashlab.traffic")
    assert may_import("flashlab.rect", "flashlab.pipeline.schedule")
    assert may_import("flashlab.mla", "flashlab.api")
    assert may_import("flashlab.replay", "flashlab.kernels.tile")
    assert may_import("flashlab.pipeline.simulate", "flashlab.arguments")
    # the CUDA twin sits on the kernels' floor: below the API and the doors, above validation
    assert may_import("flashlab.gpu.attention", "flashlab.validation")
    assert not may_import("flashlab.gpu.attention", "flashlab.api")
    assert not may_import("flashlab.gpu.forward", "flashlab.compat")
    # the twin compiles the CPU kernels' per-row update (one source, flashlab.kernels.rowstep)
    assert may_import("flashlab.gpu.tiles", "flashlab.kernels.rowstep")
    # validation keeps the scores stage's record, with its rule, from the options record
    assert may_import("flashlab.validation", "flashlab.kernels.options")
    assert not may_import("flashlab.validation", "flashlab.kernels.tile")
    assert may_import("flashlab.compat", "flashlab.gpu.attention")
    # and inside a package, its floors
    assert not may_import_within("flashlab.gpu.tiles", "flashlab.gpu.forward")
    assert not may_import_within("flashlab.kernels.tile", "flashlab.kernels.forward")
    assert not may_import_within("flashlab.cann.plan", "flashlab.cann.operator")
    assert may_import_within("flashlab.gpu.attention", "flashlab.gpu.target")
    assert may_import_within("flashlab.cann.plan", "flashlab.masks")


@pytest.mark.parametrize("module", ["flashlab", "flashlab.pipeline", "flashlab.pipeline.settings"])
def test_the_hardware_model_and_the_package_face_load_without_numba(module):
    code = f"import sys, {module}; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    assert out.stdout.strip() == "False", f"import {module} loaded numba"


def test_the_package_face_imports_its_names_on_first_use():
    import flashlab

    code = ("import sys, flashlab; f = flashlab.flash_attention; "
            "print(f.__module__, 'numba' in sys.modules, flashlab.flops.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    assert out.stdout.split() == ["flashlab.api", "True", "flashlab.flops"]
    assert flashlab.__all__ == [name for names in flashlab._EXPORTS.values() for name in names]
    with pytest.raises(AttributeError, match="no_such_name"):
        flashlab.no_such_name  # noqa: B018


def test_no_cycles():
    graph = {m: {d for d in deps if not any(m == a and d.startswith(b) for a, b in ALLOWED_UPWARD)}
             for m, deps in import_graph().items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def format_graph() -> str:
    """One line per module: ``module -> its flashlab imports``."""
    return "\n".join(f"{m} -> {', '.join(sorted(d))}" for m, d in sorted(import_graph().items()))


if __name__ == "__main__":
    print(format_graph())
