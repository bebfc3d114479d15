"""Write (or check) the Colab install cell of every chapter notebook.

The book's launch buttons open a chapter in Google Colab, where ``flashlab`` is not installed.
Each notebook therefore carries, right after its title cell, one code cell that installs the
package from the repository, **at the release tag** ``v<flashlab.__version__>`` (never a moving
branch: the notebook and the package it runs stay the same release), **only when running in Colab** (``"google.colab" in
sys.modules``); everywhere else (``make lab``, nbval, the book build) it does nothing. The cell
is tagged ``remove-cell``, so the HTML book does not show it.

The repository URL is read from ``_config.yml`` (``repository.url``), the one place that names
it, and the version from ``flashlab/__init__.py`` (``__version__``, the package's one version
source, which ``pyproject.toml`` reads too): tag each release ``v<version>``.
``python tools/colab_cell.py`` rewrites the cells after a change there;
``--check`` exits 1 listing the notebooks whose cell is missing or stale (run by the tests).
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MARKER = "# Colab only:"


def repository() -> tuple[str, str]:
    """``(url, branch)`` of the repository, from ``_config.yml``."""
    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def version() -> str:
    """``flashlab.__version__``, read from the source without importing the package."""
    tree = ast.parse((ROOT / "flashlab" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError("flashlab/__init__.py sets no __version__")


def release_tag() -> str:
    """The git tag of this release, ``v<version>`` (e.g. ``v0.1.0``), that the Colab cell installs."""
    return f"v{version()}"


def cell_source() -> str:
    url, _ = repository()
    return (f"{MARKER} install this release of flashlab ({release_tag()}; elsewhere `make lab` set it up)\n"
            "import sys\n"
            "\n"
            "if \"google.colab\" in sys.modules:\n"
            f"    %pip install --quiet \"flashlab[widgets] @ git+{url}@{release_tag()}\"\n"
            "    from google.colab import output\n"
            "\n"
            "    output.enable_custom_widget_manager()  # ipywidgets 8 in Colab\n")


def chapter_notebooks() -> list[Path]:
    """The notebooks of ``_toc.yml`` (the API page included)."""
    from tools.check_site import toc_pages
    return [ROOT / f"{p}.ipynb" for p in toc_pages(ROOT / "_toc.yml") if (ROOT / f"{p}.ipynb").exists()]


def _find(nb: dict) -> int | None:
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code" and "".join(cell["source"]).startswith(MARKER):
            return i
    return None


def update(path: Path) -> bool:
    """Insert or refresh the cell in ``path`` (after the first cell); True if the file changed."""
    nb = json.loads(path.read_text())
    source = cell_source()
    i = _find(nb)
    if i is not None and "".join(nb["cells"][i]["source"]) == source:
        return False
    cell = {"cell_type": "code", "execution_count": None, "id": "colab-install",
            "metadata": {"tags": ["remove-cell"]}, "outputs": [], "source": source.splitlines(True)}
    if i is None:
        nb["cells"].insert(1, cell)
    else:
        nb["cells"][i].update(source=cell["source"], metadata=cell["metadata"])
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return True


def stale(path: Path) -> bool:
    nb = json.loads(path.read_text())
    i = _find(nb)
    return i is None or "".join(nb["cells"][i]["source"]) != cell_source() \
        or "remove-cell" not in nb["cells"][i]["metadata"].get("tags", [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    paths = chapter_notebooks()
    if args.check:
        bad = [p for p in paths if stale(p)]
        for p in bad:
            print(f"stale or missing Colab cell: {p.relative_to(ROOT)} (run python tools/colab_cell.py)")
        return 1 if bad else 0
    for p in paths:
        if update(p):
            print(f"updated {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
