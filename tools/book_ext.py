"""Sphinx fixes for the book, loaded by ``_config.yml`` (``sphinx.local_extensions``).

``dedupe_scripts``: with Jupyter Book 1.0.4, sphinx-thebe 0.3.1 and sphinx-togglebutton
0.4.5 register their inline configuration scripts twice (their ``env-before-read-docs``
handlers run for each read pass), so every page declared ``const THEBE_JS_URL`` twice and
the browser raised "SyntaxError: Identifier 'THEBE_JS_URL' has already been declared"
(found by ``tools/check_site.py``). This handler keeps the first of identical scripts.
"""
from __future__ import annotations

from typing import Any


def dedupe_scripts(app, pagename: str, templatename: str, context: dict[str, Any], doctree) -> None:
    """Drop repeated entries (same file or body and same attributes) from the page's scripts."""
    seen: set[tuple] = set()
    unique = []
    for js in context.get("script_files", []):
        # the copies differ only in filename None vs "" (inline scripts), so compare "or ''"
        filename = str(getattr(js, "filename", js) or "")
        attributes = getattr(js, "attributes", {}) or {}
        key = (filename, tuple(sorted((k, str(v)) for k, v in attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    if "script_files" in context:
        # in place: the list is the builder's own, and handlers that run later (MathJax's, for
        # one) append to it; a new list here would silently drop their scripts
        context["script_files"][:] = unique


def setup(app) -> dict[str, Any]:
    # Run early: html-page-context is emitted with emit_firstresult, so a handler that returns a
    # template name stops the later ones (a late priority was never reached). The duplicates are
    # registered before any page is written, so they are already in the context here.
    app.connect("html-page-context", dedupe_scripts, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
