"""The package's import graph: no cycles, and no module imports a module of a higher layer.

Every module's imports are read with ``ast`` -- at module level and inside functions alike, so
an import hidden in a function body to dodge a cycle is still an edge. Layers, bottom first;
a module may import modules of its own layer or below (within a layer, no cycles).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flashlab"

#: bottom first; a module belongs to the first layer with a prefix matching its name
LAYERS: list[tuple[str, ...]] = [
    ("flashlab.data", "flashlab.numba_cache", "flashlab.arguments", "flashlab.tiling", "flashlab.dataflows", "flashlab.memory",
     "flashlab.input_scan",
     "flashlab.viz.code"),
    ("flashlab.dropout", "flashlab.masks", "flashlab.rope"),
    ("flashlab.validation",),
    ("flashlab.reference",),
    ("flashlab.kernels",),
    ("flashlab.api",),
    ("flashlab.cann", "flashlab.compat"),
    ("flashlab.__init__", "flashlab.torch_attention"),
    ("flashlab.cost", "flashlab.mla"),
    ("flashlab.pipeline.params",),
    ("flashlab.pipeline.roofline",),
    ("flashlab.pipeline.profiles",),
    ("flashlab.pipeline.hardware",),
    ("flashlab.pipeline.simulate",),
    ("flashlab.pipeline.schedule", "flashlab.pipeline.replay", "flashlab.pipeline.settings",
     "flashlab.pipeline.__init__"),
    ("flashlab.rect", "flashlab.vendor"),
    ("flashlab.viz",),
    ("flashlab.walk", "flashlab.exercises"),
    ("flashlab.widgets.tiles", "flashlab.widgets.pipeline"),
    ("flashlab.widgets.__init__", "flashlab.widgets_pipeline"),
    ("flashlab.bench",),
]

#: upward edges tolerated, each with its reason (none today)
ALLOWED_UPWARD: set[tuple[str, str]] = set()


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


def layer_of(name: str) -> int:
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if name == prefix or name.startswith(prefix + "."):
                return i
    raise LookupError(name)


def test_every_module_has_a_layer():
    missing = [m for m in import_graph() if not _has_layer(m)]
    assert not missing, f"modules missing from LAYERS: {missing}"


def _has_layer(name: str) -> bool:
    try:
        layer_of(name)
    except LookupError:
        return False
    return True


def test_no_upward_import():
    bad = []
    for mod, deps in import_graph().items():
        for dep in deps:
            if layer_of(dep) > layer_of(mod) and (mod, dep.removesuffix(".__init__")) not in ALLOWED_UPWARD \
                    and not any(mod == a and dep.startswith(b) for a, b in ALLOWED_UPWARD):
                bad.append(f"{mod} (layer {layer_of(mod)}) -> {dep} (layer {layer_of(dep)})")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


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
