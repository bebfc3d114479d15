"""Fetch the JavaScript the static book needs from the npm registry, so the site works offline.

The HTML book must show its saved widget views and its math without reaching a CDN (a reader
offline or behind a firewall). Two npm packages provide that:

* ``@jupyter-widgets/html-manager``: ``dist/embed.js`` renders the widget state that
  myst-nb saves in a page (the non-AMD bundle: it carries the base, controls and output
  widgets and needs no RequireJS), plus the icon fonts its CSS refers to;
* ``mathjax`` 3: the ``es5/`` component tree (``tex-mml-chtml.js`` and the fonts and
  extensions it loads relative to itself);
* ``@fontsource/noto-sans-sc``: one webfont file, the simplified-Chinese subset of Noto Sans
  SC in weight 400 (woff2, about 1.1 MB; the glossary's 中文 column and the Chinese terms of
  the chapters). ``book/_static/cjk-font.css`` declares it with a ``unicode-range`` limited
  to CJK, so a browser downloads it only for a page that has CJK characters, and puts it
  first in the theme's font stack for those characters only. Without it a reader whose
  system has no CJK font sees boxes.

``make book`` runs this script before Sphinx; it downloads each pinned tarball once, checks
its ``sha512`` integrity against the value pinned here, and unpacks the needed files into
``_vendor/`` (git-ignored, nothing is vendored into the repository). ``_config.yml`` lists
``_vendor`` in ``html_static_path`` so the files are served from the site's ``_static/``.
Run ``python tools/web_assets.py --check`` to only verify that they are in place.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import shutil
import sys
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "_vendor"
REGISTRY = "https://registry.npmjs.org"


@dataclass(frozen=True)
class Asset:
    """One npm package: what to unpack (prefixes inside ``package/``) and where (under _vendor/)."""

    name: str
    version: str
    integrity: str          # the registry's dist.integrity ("sha512-<base64>")
    keep: tuple[str, ...]   # path prefixes inside the tarball's package/ folder
    skip: tuple[str, ...]   # suffixes not needed by a browser (source maps, AMD builds)
    target: str             # folder under _vendor/ (served as _static/<target>/)

    @property
    def url(self) -> str:
        return f"{REGISTRY}/{self.name}/-/{self.name.split('/')[-1]}-{self.version}.tgz"


ASSETS = (
    Asset("@jupyter-widgets/html-manager", "1.0.15",
          "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
          keep=("dist/",), skip=(".map", "-amd.js", ".LICENSE.txt"), target="widgets"),
    Asset("mathjax", "3.2.2",
          "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
          keep=("es5/",), skip=(".map",), target="mathjax"),
    Asset("@fontsource/noto-sans-sc", "5.3.0",
          "sha512-HeqIlGm0+ohOKxZLuHj1qW6r6avHH0OWdKERAcSDI0RQ+MXrteuLKA+M+5eOA8rYy0MFvOR5AT0fQo2rUkye0Q==",
          keep=("files/noto-sans-sc-chinese-simplified-400-normal.woff2",), skip=(),
          target="fonts/noto-sans-sc"),
)


def _stamp(asset: Asset) -> Path:
    return VENDOR / asset.target / ".version"


def is_current(asset: Asset) -> bool:
    """True when ``_vendor/<target>`` holds this exact pinned version."""
    stamp = _stamp(asset)
    return stamp.is_file() and stamp.read_text().strip() == f"{asset.name}@{asset.version}"


def fetch(asset: Asset) -> None:
    """Download, verify and unpack one asset into ``_vendor/<target>``.

    Raises ``RuntimeError`` if the download's sha512 differs from the pinned integrity.
    """
    with urllib.request.urlopen(asset.url, timeout=120) as response:
        data = response.read()
    algo, _, expected = asset.integrity.partition("-")
    digest = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if digest != expected:
        raise RuntimeError(f"{asset.name}@{asset.version}: {algo} of the download is {digest}, "
                           f"expected {expected} (pinned in tools/web_assets.py)")
    dest = VENDOR / asset.target
    shutil.rmtree(dest, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            inner = member.name.removeprefix("package/")
            if not member.isfile() or not inner.startswith(asset.keep) or inner.endswith(asset.skip):
                continue
            for prefix in asset.keep:            # es5/tex-chtml.js -> mathjax/tex-chtml.js
                if inner.startswith(prefix):
                    # a kept file (not a folder) keeps its name: files/x.woff2 -> x.woff2
                    inner = inner[len(prefix):] or Path(prefix).name
                    break
            out = dest / inner
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(tar.extractfile(member).read())
    _stamp(asset).write_text(f"{asset.name}@{asset.version}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, download nothing")
    args = parser.parse_args(argv)
    missing = [a for a in ASSETS if not is_current(a)]
    if args.check:
        for a in missing:
            print(f"missing: {a.name}@{a.version} in _vendor/{a.target}", file=sys.stderr)
        return 1 if missing else 0
    for n, a in enumerate(missing):
        print(f"fetching {a.name}@{a.version} from the npm registry into _vendor/{a.target}")
        try:
            fetch(a)
        except OSError as error:   # URLError, a timeout, a refused connection: offline
            print(offline_message(missing[n:], error), file=sys.stderr)
            return 1
    return 0


def offline_message(missing: list[Asset], error: BaseException) -> str:
    """One message for a failed download: what is missing, why, and the command to fetch it.

    ``make book`` stops with it instead of a ``URLError`` traceback when the machine is
    offline (or the registry unreachable) and ``_vendor/`` lacks an asset.
    """
    reason = getattr(error, "reason", None) or error
    names = "\n".join(f"  {a.name}@{a.version}  ({a.url}) -> _vendor/{a.target}" for a in missing)
    return (f"web_assets: cannot download the web assets the book needs ({reason}).\n"
            f"Missing:\n{names}\n"
            f"The book serves them itself so that the site works offline; fetch them once with a "
            f"network connection:\n  python tools/web_assets.py      (or: make assets)\n"
            f"then run make book again.")


if __name__ == "__main__":
    sys.exit(main())
