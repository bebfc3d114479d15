"""Open every page of the built book in headless Chromium, offline, and fail on what a reader would hit.

For each page of ``_toc.yml`` (served from ``_build/html`` on 127.0.0.1, every other host
unreachable: a proxy that refuses connections and a resolver that finds no name), it checks

* no JavaScript error: uncaught exceptions, ``console.error`` and browser log errors (a
  failed load of a CDN script shows up here, since the network is off);
* no missing image (an ``<img>`` that did not load) and no image without ``alt`` text (an
  ``alt`` that is only the file name, Sphinx's default, counts as none);
* no empty widget area: every saved widget view was rendered by the widget manager;
* math was typeset (MathJax loaded from the site, not a CDN);
* a notebook page was executed: it has cell outputs and no error output;

* nothing in the text column overflows without a visible way to reach it, with the window 1280
  px wide and 390 px wide (a phone): no box that clips its content (a wide equation cut at the
  column's edge), no box that scrolls without a scrollbar on a device with overlay scrollbars,
  nothing sticking out of the column (:data:`OVERFLOW_JS`);

* every static explorer (``div.flashlab-explorer``, :mod:`flashlab.widgets.explorer`) responds:
  it is interactive within :data:`READY_LIMIT_MS` of the page's load event (the time from its
  script to its first picture is printed too: it includes the page's other loading work, which
  shares the main thread); every control is
  moved through its values (a disabled one from a state where it matters), and each must change
  the picture or the numbers under it, within :data:`RESPONSE_LIMIT_MS` (each move timed twice,
  the faster counts: a stall of the shared machine hits one, a slow state both); for
  :data:`SAMPLES` sampled states the numbers the page shows equal those the explorer's Python
  code computes (:meth:`flashlab.widgets.explorer.Explorer.numbers`), with a screenshot of each
  as ``<page>-explorer<n>-<k>.png``; it adds at most 2 MB to the page (:func:`check_explorers`);

and, over every HTML file of the site, that each internal link points to an existing file
and, if it has a ``#fragment``, to an existing anchor in it. One screenshot per page is
saved under ``_build/screenshots/`` (the top of the page, up to ``--max-height`` pixels), one
at the phone's width as ``<page>-phone.png``, and
one per animation and saved widget view on it, scrolled into view and clipped to the element,
as ``<page>-<n>.png`` (n = 1, 2, ... in page order): these show the tile explorer and the
animations even where the page is taller than the full-page screenshot.

It talks to Chromium through the DevTools protocol over a WebSocket (``websocket-client``).
Usage: ``python tools/check_site.py [--html _build/html] [--only intro,masks]``; exit 1 on
any problem, listing every problem found.
"""
from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import math
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import websocket
import yaml

ROOT = Path(__file__).resolve().parent.parent

# Evaluated in the page once it has loaded and settled: everything the checks need, as JSON.
#: the book's CJK webfont: the family book/_static/cjk-font.css declares, and its file
CJK_FAMILY = "flashlab CJK"
CJK_FILE = "noto-sans-sc-chinese-simplified-400-normal.woff2"

PAGE_PROBE = r"""
(() => {
  const CJK_FAMILY = "%s", CJK_FILE = "%s";
  const imgs = [...document.images];
  const views = [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')];
  const emptyViews = views.filter(s => {
    const area = s.parentElement;
    const w = area && area.querySelector('.jupyter-widgets, .widget-subarea, .lm-Widget');
    return !w || w.getBoundingClientRect().height < 5;
  }).length;
  return {
    title: document.title,
    brokenImages: imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.currentSrc || i.src),
    // Sphinx writes the file name as alt when none was given: that is no description either
    noAlt: imgs.filter(i => {
      const alt = (i.getAttribute('alt') || '').trim();
      return !alt || /\.(png|jpe?g|svg|gif)$/i.test(alt) || alt.startsWith('data:');
    }).map(i => (i.getAttribute('src') || '').slice(0, 60)),
    widgetViews: views.length,
    emptyWidgetViews: emptyViews,
    mathSources: document.querySelectorAll('.math, span.math, div.math').length,
    mathTypeset: document.querySelectorAll('mjx-container').length,
    cellOutputs: document.querySelectorAll('.cell_output').length,
    errorOutputs: document.querySelectorAll('.cell_output .traceback, .cell_output .output.error').length,
    height: Math.max(document.body.scrollHeight, document.documentElement.scrollHeight),
    // the site's own CJK webfont (book/_static/cjk-font.css): a page with CJK text must load
    // it (status "loaded", fetched from the site), a page without must not (unicode-range)
    cjkText: /[\u3000-\u30ff\u3400-\u4dbf\u4e00-\u9fff]/.test(document.body.innerText),
    cjkFace: [...document.fonts].filter(f => f.family.replace(/["']/g, '') === CJK_FAMILY).map(f => f.status),
    cjkRequested: performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes(CJK_FILE)),
  };
})()
""" % (CJK_FAMILY, CJK_FILE)


#: the reports of :func:`check_explorers` on every page checked so far (printed by main)
EXPLORER_REPORTS: list[dict] = []

#: the window widths every page is checked at: a laptop, and a phone (portrait)
WIDTHS = {"desktop": 1280, "phone": 390}

# Content that overflows with no way to reach it, in the page's text column (the article), as a
# list of descriptions. Three kinds:
# 1. a box that clips (overflow-x hidden or clip) with content past its edges: the rest is cut
#    off. The content is measured from the boxes inside it (not scrollWidth, which counts
#    MathJax's invisible assistive MathML, as wide as the formula, beside the formula);
# 2. a box that scrolls (overflow-x auto or scroll) and has content out of view, but shows no
#    scrollbar. The check runs with overlay scrollbars, as macOS and phones draw them: none until
#    one scrolls, so a reader cannot see that there is more. A styled scrollbar (the book's
#    wide-content.css) is drawn always and takes its height in the box;
# 3. a box that sticks out of the text column with no scrolling box between it and the column:
#    it runs under the sidebar or off the screen.
# Skipped: what is not shown (display none, visibility hidden, screen-reader-only text, MathJax's
# assistive MathML and its layout internals) and positioned overlays.
OVERFLOW_JS = r"""
(() => {
  const root = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const rootBox = root.getBoundingClientRect();
  const out = [], overlays = [], handled = [], spilling = [];
  const describe = el => {
    let name = el.tagName.toLowerCase() + [...el.classList].slice(0, 3).map(c => '.' + c).join('');
    const section = el.closest('section[id]');
    const text = (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 70);
    return `${name}${section ? ' in #' + section.id : ''}: "${text}"`;
  };
  const invisible = '.sr-only, .visually-hidden, mjx-assistive-mml, [hidden]';
  const shown = (el, cs) => cs.display !== 'none' && cs.visibility !== 'hidden' && !el.closest(invisible);
  const scrolls = cs => cs.overflowX === 'auto' || cs.overflowX === 'scroll';
  const clips = cs => cs.overflowX === 'hidden' || cs.overflowX === 'clip';
  // how far the boxes inside el reach past el's padding box, left and right (CSS px); a box that
  // scrolls counts with its own box, not with what it scrolls (that is its own check)
  const past = el => {
    const box = el.getBoundingClientRect(), cs = getComputedStyle(el);
    const left = box.left + parseFloat(cs.borderLeftWidth), right = box.right - parseFloat(cs.borderRightWidth);
    let lo = left, hi = right;
    const walk = parent => {
      for (const inner of parent.children) {
        if (inner.matches(invisible)) continue;
        const r = inner.getBoundingClientRect();
        if (r.width > 0 && r.height > 0) { lo = Math.min(lo, r.left); hi = Math.max(hi, r.right); }
        if (!scrolls(getComputedStyle(inner))) walk(inner);
      }
    };
    walk(el);
    return Math.round(Math.max(hi - right, left - lo));
  };
  for (const el of [root, ...root.querySelectorAll('*')]) {
    if (overlays.some(o => o.contains(el)) || handled.some(h => h.contains(el))) continue;
    const cs = getComputedStyle(el);
    if (!shown(el, cs)) continue;
    if (cs.position === 'fixed' || cs.position === 'absolute') { overlays.push(el); continue; }
    if (el.tagName.startsWith('MJX-') && el.tagName !== 'MJX-CONTAINER') continue;
    if (clips(cs) || scrolls(cs)) {
      // what a scrolling box holds is reachable through it; a clipping box that cuts something
      // off is reported once, the boxes inside it not
      if (scrolls(cs)) handled.push(el);
      if (el.scrollWidth <= el.clientWidth + 1) continue;      // nothing out of view (cheap test)
      const hidden = past(el);
      if (hidden <= 1) continue;
      const bar = el.offsetHeight - el.clientHeight - parseFloat(cs.borderTopWidth) - parseFloat(cs.borderBottomWidth);
      if (clips(cs)) {
        out.push(`cut off: ${hidden} px hidden (overflow-x: ${cs.overflowX}): ${describe(el)}`);
        handled.push(el);
      } else if (bar < 2)
        out.push(`scrolls sideways (${hidden} px out of view) but shows no scrollbar: ${describe(el)}`);
      if (el !== root) {
        const box = el.getBoundingClientRect();
        const beyond = Math.round(Math.max(box.right - rootBox.right, rootBox.left - box.left));
        if (beyond > 1) spilling.push([el, beyond]);
      }
      continue;
    }
    if (el === root) continue;
    // the box, or its content spilling out of it (overflow visible), past the column's edges
    const box = el.getBoundingClientRect();
    if (box.width === 0 && box.height === 0) continue;
    const right = Math.max(box.right, box.left + el.scrollWidth);
    const beyond = Math.round(Math.max(right - rootBox.right, rootBox.left - box.left));
    if (beyond > 1) spilling.push([el, beyond]);
  }
  // the innermost of nested spilling boxes names the culprit (its ancestors only carry it)
  for (const [el, beyond] of spilling) {
    if (!spilling.some(([other]) => other !== el && el.contains(other)))
      out.push(`sticks out of the text column by ${beyond} px: ${describe(el)}`);
  }
  return out;
})()
"""


# The elements that get a screenshot of their own, in page order: animations (matplotlib's
# ``to_jshtml`` player, ``div.animation``, inside ``figure.flashlab-animation`` when it has a
# caption) and the output areas of saved widget views. An element inside another is skipped.
ELEMENTS_JS = r"""
(() => {
  const found = [...document.querySelectorAll('.flashlab-animation, div.animation')];
  for (const s of document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')) {
    const area = s.closest('.cell_output') || s.parentElement;
    if (area) found.push(area);
  }
  const unique = [...new Set(found)].filter(e => !found.some(o => o !== e && o.contains(e)));
  return unique.sort((a, b) => a.compareDocumentPosition(b) & Node.DOCUMENT_POSITION_FOLLOWING ? -1 : 1);
})()
"""


def element_rect_js(index: int) -> str:
    """JavaScript that scrolls element ``index`` of :data:`ELEMENTS_JS` to the top of the view and
    returns its box in document coordinates (null if there is no such element)."""
    return (f"(() => {{ const e = {ELEMENTS_JS.strip()}[{int(index)}]; if (!e) return null; "
            "e.scrollIntoView({block: 'start'}); const r = e.getBoundingClientRect(); "
            "return {x: r.left + window.scrollX, y: r.top + window.scrollY, "
            "width: r.width, height: r.height}; })()")


def element_clip(box: dict | None, page_width: int = 1280) -> dict | None:
    """The ``Page.captureScreenshot`` clip for an element box (document CSS pixels): whole
    pixels, inside the page's width; None for a missing or invisible (under 2 x 2 px) element."""
    if not box or box["width"] < 2 or box["height"] < 2:
        return None
    x, y = max(0, math.floor(box["x"])), max(0, math.floor(box["y"]))
    width = min(page_width, math.ceil(box["x"] + box["width"])) - x
    height = math.ceil(box["y"] + box["height"]) - y
    if width < 2:
        return None
    return {"x": x, "y": y, "width": width, "height": height, "scale": 1}


def element_shot_path(shot: Path, n: int) -> Path:
    """``<page>-<n>.png`` beside the page's own screenshot ``<page>.png`` (n from 1)."""
    return shot.with_name(f"{shot.stem}-{n}{shot.suffix}")


class CDP:
    """A minimal synchronous Chrome DevTools Protocol client over one browser WebSocket."""

    def __init__(self, ws_url: str):
        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(method)

    def wait_event(self, method: str, session: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(e.get("method") == method and e.get("sessionId") == session for e in self.events):
                return True
            self.ws.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                self.events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                break
            finally:
                self.ws.settimeout(60)
        return False

    def drain(self, seconds: float) -> None:
        """Collect the events that arrive during ``seconds``."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.ws.settimeout(left)
            try:
                self.events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                break
        self.ws.settimeout(60)


def toc_pages(toc: Path) -> list[str]:
    """Docnames of ``_toc.yml`` in reading order (root first)."""
    data = yaml.safe_load(toc.read_text())
    pages = [data["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                pages.append(node["file"])
            for key in ("parts", "chapters", "sections"):
                for child in node.get(key, []):
                    walk(child)
    walk(data)
    return [p.removesuffix(".md").removesuffix(".ipynb") for p in pages]


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> _Links:
    p = _Links()
    p.feed(path.read_text(encoding="utf-8", errors="replace"))
    return p


def check_links(html_root: Path) -> list[str]:
    """Every internal ``<a href>`` of every page resolves to a file, and its #fragment to an id."""
    problems = []
    skip_dirs = {"_static", "_sources", "_images"}
    for page in sorted(html_root.rglob("*.html")):
        if skip_dirs & set(page.relative_to(html_root).parts):
            continue
        for href in _parse(page).hrefs:
            parsed = urlparse(href)
            if parsed.scheme or href.startswith(("//", "mailto:", "javascript:")):
                continue
            path, frag = urldefrag(href)
            target = (page.parent / unquote(path)).resolve() if path else page
            if target.is_dir():
                target = target / "index.html"
            rel = page.relative_to(html_root)
            if not target.exists():
                root = html_root.resolve()
                missing = target.relative_to(root) if target.is_relative_to(root) else target
                problems.append(f"{rel}: broken link {href!r} (no file {missing})")
            elif frag and target.suffix == ".html" and unquote(frag) not in _parse(target).ids:
                problems.append(f"{rel}: broken anchor {href!r}")
    return problems


def _serve(html_root: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    handler = functools.partial(Quiet, directory=str(html_root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def _launch_chromium(binary: str, profile: Path) -> tuple[subprocess.Popen, str]:
    args = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--mute-audio",      # scrollbars shown: the overflow check measures them
            # network off: every host but 127.0.0.1 unresolvable, and any connection through a
            # proxy that refuses it (loopback bypasses proxies)
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
            "--proxy-server=http://127.0.0.1:9", "--disable-quic",
            f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = profile / "DevToolsActivePort"
    for _ in range(300):
        if port_file.exists() and len(port_file.read_text().split()) >= 2:
            port, path = port_file.read_text().split()[:2]
            return proc, f"ws://127.0.0.1:{port}{path}"
        if proc.poll() is not None:
            raise RuntimeError(f"{binary} exited with code {proc.returncode} before it started")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{binary} did not open its DevTools port within 30 s")


def _event_errors(events: list[dict], session: str) -> list[str]:
    out = []
    urls = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in events
            if e.get("sessionId") == session and e.get("method") == "Network.requestWillBeSent"}
    for e in events:
        if e.get("sessionId") != session:
            continue
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            out.append("JS exception: " + (d.get("exception", {}).get("description") or d.get("text", ""))[:300])
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console.error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                    for a in p.get("args", []))[:300])
        elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
            out.append(f"browser error: {p['entry'].get('text', '')[:200]} {p['entry'].get('url', '')}")
        elif m == "Network.loadingFailed" and not p.get("canceled"):
            out.append(f"failed to load ({p.get('errorText')}): {urls.get(p.get('requestId'), '?')[:200]}")
        elif m == "Network.responseReceived" and p["response"].get("status", 200) >= 400:
            out.append(f"HTTP {p['response']['status']}: {p['response'].get('url', '')[:200]}")
    return out


def cjk_font_problems(probe: dict) -> list[str]:
    """What is wrong with the CJK webfont on a page, from :data:`PAGE_PROBE`'s fields.

    A page with CJK characters must have loaded the site's face (``document.fonts`` status
    ``loaded``, its file requested from the site): a system font drawing them (Debian's
    ``fonts-noto-cjk`` on the build machine) would hide a missing or unused webfont. A page
    without CJK characters must not have downloaded it (the ``unicode-range`` at work).
    """
    if probe["cjkText"]:
        if not probe["cjkFace"]:
            return [f"CJK text but no @font-face {CJK_FAMILY!r} (is cjk-font.css in html_css_files?)"]
        if "loaded" not in probe["cjkFace"] or not probe["cjkRequested"]:
            return [f"CJK text but the site's CJK font was not loaded (status {probe['cjkFace']}, "
                    f"requests {probe['cjkRequested']}): _static/fonts/noto-sans-sc/{CJK_FILE}"]
    elif probe["cjkRequested"]:
        return [f"no CJK text, yet the CJK font was downloaded ({probe['cjkRequested'][0]}): "
                "its unicode-range should prevent that"]
    return []


def check_page(cdp: CDP, url: str, shot: Path, *, notebook: bool, settle: float,
               max_height: int) -> list[str]:
    target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    try:
        for domain in ("Page", "Runtime", "Log", "Network"):
            cdp.send(f"{domain}.enable", session=session)
        cdp.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
        cdp.events.clear()
        cdp.send("Page.navigate", {"url": url}, session=session)
        problems = [] if cdp.wait_event("Page.loadEventFired", session, 60) else ["page did not finish loading in 60 s"]
        # the widget manager and MathJax render after load: wait ``settle`` seconds, then poll
        # until both are done (or 20 s more passed, on a loaded machine), and report what is left
        cdp.drain(settle)
        deadline = time.monotonic() + 20
        while True:
            probe = cdp.send("Runtime.evaluate", {"expression": PAGE_PROBE, "returnByValue": True},
                             session=session)["result"]["value"]
            rendered = ((not probe["mathSources"] or probe["mathTypeset"])
                        and not probe["emptyWidgetViews"]
                        and (not probe["cjkText"] or "loaded" in probe["cjkFace"]))
            if rendered or time.monotonic() > deadline:
                break
            cdp.drain(0.5)
        problems += _event_errors(cdp.events, session)
        problems += [f"missing image: {src}" for src in probe["brokenImages"]]
        problems += [f"image without alt text: {src}" for src in probe["noAlt"]]
        if probe["emptyWidgetViews"]:
            problems.append(f"{probe['emptyWidgetViews']} of {probe['widgetViews']} widget areas are empty")
        if probe["mathSources"] and not probe["mathTypeset"]:
            problems.append(f"{probe['mathSources']} math elements but none typeset (MathJax not loaded?)")
        problems += cjk_font_problems(probe)
        if notebook and not probe["cellOutputs"]:
            problems.append("notebook page has no cell outputs (not executed?)")
        if probe["errorOutputs"]:
            problems.append(f"{probe['errorOutputs']} error outputs (tracebacks) on the page")
        found, reports = check_explorers(cdp, session, shot)
        problems += found
        EXPLORER_REPORTS.extend(reports)
        problems += _overflow_problems(cdp, session, WIDTHS["desktop"])
        height = min(max_height, int(probe["height"]))
        cdp.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        cdp.drain(0.3)
        png = cdp.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        shot.write_bytes(base64.b64decode(png))
        problems += _element_shots(cdp, session, shot)
        # the phone: the same checks of overflow at 390 px, and a screenshot <page>-phone.png
        problems += _overflow_problems(cdp, session, WIDTHS["phone"])
        page_height = cdp.send("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                                    "returnByValue": True}, session=session)["result"]["value"]
        cdp.send("Emulation.setDeviceMetricsOverride",
                 {"width": WIDTHS["phone"], "height": min(max_height, int(page_height)),
                  "deviceScaleFactor": 1, "mobile": True}, session=session)
        cdp.drain(0.3)
        png = cdp.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"]
        phone_shot_path(shot).write_bytes(base64.b64decode(png))
        return problems
    finally:
        cdp.send("Target.closeTarget", {"targetId": target})


def phone_shot_path(shot: Path) -> Path:
    """``<page>-phone.png`` beside the page's own screenshot ``<page>.png`` (390 px wide)."""
    return shot.with_name(f"{shot.stem}-phone{shot.suffix}")


def _overflow_problems(cdp: CDP, session: str, width: int) -> list[str]:
    """:data:`OVERFLOW_JS` on the open page with the window ``width`` CSS pixels wide.

    The page is laid out as on a device with overlay scrollbars (DevTools' mobile emulation:
    macOS and phones draw none until one scrolls), so a box that scrolls passes only when it
    draws a scrollbar of its own."""
    cdp.send("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": True}, session=session)
    cdp.drain(0.5)      # the relayout, and MathJax's re-measuring of its containers
    found = cdp.send("Runtime.evaluate", {"expression": OVERFLOW_JS, "returnByValue": True},
                     session=session)["result"]["value"]
    return [f"at {width} px: {problem}" for problem in found]


def _element_shots(cdp: CDP, session: str, shot: Path) -> list[str]:
    """Screenshot every element of :data:`ELEMENTS_JS` on the open page, clipped to it, as
    ``<page>-<n>.png``; stale ones of an earlier run are removed first. Returns problems."""
    for old in shot.parent.glob(f"{shot.stem}-*{shot.suffix}"):
        if old.stem.removeprefix(f"{shot.stem}-").isdigit():
            old.unlink()
    evaluate = functools.partial(cdp.send, "Runtime.evaluate", session=session)
    count = evaluate({"expression": f"{ELEMENTS_JS.strip()}.length", "returnByValue": True})["result"]["value"]
    problems, n = [], 0
    for i in range(count):
        # a viewport as tall as the element (at least 900 px), so that the whole of it is painted
        box = evaluate({"expression": element_rect_js(i), "returnByValue": True})["result"].get("value")
        height = max(900, int(box["height"]) + 20) if box else 900
        cdp.send("Emulation.setDeviceMetricsOverride",
                 {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
        box = evaluate({"expression": element_rect_js(i), "returnByValue": True})["result"].get("value")
        cdp.drain(0.3)
        clip = element_clip(box)
        if clip is None:
            problems.append(f"element screenshot {i + 1}: the element is missing or has no size ({box})")
            continue
        png = cdp.send("Page.captureScreenshot", {"format": "png", "clip": clip}, session=session)["data"]
        n += 1
        element_shot_path(shot, n).write_bytes(base64.b64decode(png))
    return problems

#: an explorer must be interactive within this many ms of the page's load event (issue 33)
READY_LIMIT_MS = 1000.0
#: a control must respond (state looked up, picture and numbers redrawn, laid out) within this
RESPONSE_LIMIT_MS = 50.0
#: sampled states per explorer whose numbers are compared with Python's
SAMPLES = 3

# The static explorers of the open page: id, kind, constructor arguments, size, readiness.
EXPLORERS_JS = r"""
(() => [...document.querySelectorAll('.flashlab-explorer[data-static="1"]')].map(e => ({
  id: e.id, kind: e.dataset.explorer, args: JSON.parse(e.dataset.args),
  bytes: new Blob([e.outerHTML]).size, ready: !!e.fx,
  readyMs: e.dataset.readyMs ? +e.dataset.readyMs : null,
  bootMs: e.dataset.bootMs ? +e.dataset.bootMs : null,
  loadMs: performance.getEntriesByType('navigation')[0].loadEventEnd,
})))()
"""

# Move every control of an explorer through its values, as a reader does (input/change events on
# the page's own inputs; a disabled control first from a grid state where it is enabled), and the
# step slider of a state with frames. For each: did the picture or the numbers change, and the
# milliseconds from the event to the redrawn, laid-out explorer.
MOVE_JS = r"""
(() => {
  const root = document.getElementById(%s), fx = root.fx, P = fx.payload;
  const sizes = P.controls.map(c => c.values.length);
  const snap = () => fx.picture.innerHTML + '|' + fx.numbers.innerText;
  const fire = (input, value) => {
    const t0 = performance.now();
    input.value = value;
    input.dispatchEvent(new Event(input.tagName === 'SELECT' ? 'change' : 'input'));
    root.getBoundingClientRect(); void root.offsetHeight;      // force the layout
    return performance.now() - t0;
  };
  const indicesOf = k => sizes.map((_, n) => Math.floor(k / sizes.slice(n + 1).reduce((a, b) => a * b, 1)) %% sizes[n]);
  const report = [];
  P.controls.forEach((c, n) => {
    const input = fx.inputs[c.name];
    if (!input) return;
    // start where the control matters: the first grid state from which its next value leads
    // to another state (index = sum idx_m * stride_m, so the next value is k + stride)
    const stride = sizes.slice(n + 1).reduce((a, b) => a * b, 1);
    const k = P.lookup.findIndex((s, j) => Math.floor(j / stride) %% sizes[n] < sizes[n] - 1
                                          && P.lookup[j + stride] !== s);
    fx.set(indicesOf(Math.max(0, k)), 0);
    let changed = false, ms = [];
    let before = snap();
    for (let v = 0; v < c.values.length; v++) {
      // each move timed twice (there, back, there again), the faster one counts: another
      // process on a shared machine stalls one of them, a slow state stalls both
      const from = +input.value, to = (from + 1) %% c.values.length;
      const first = fire(input, to);
      fire(input, from);
      ms.push(Math.min(first, fire(input, to)));
      const after = snap();
      if (after !== before) changed = true;
      before = after;
    }
    report.push({name: c.name, values: c.values.length, changed, ms, disabled: input.disabled});
  });
  // the step slider: from a state with more than one frame
  const multi = P.lookup.findIndex(s => (P.states[s].frames || []).length > 1);
  if (multi >= 0) {
    fx.set(indicesOf(multi), 0);
    let before = snap(), changed = false, ms = [];
    const n = P.states[P.lookup[multi]].frames.length;
    for (let k = 1; k < Math.min(n, 12); k++) {
      const first = fire(fx.step, k);
      fire(fx.step, k - 1);
      ms.push(Math.min(first, fire(fx.step, k)));
      const after = snap();
      if (after !== before) changed = true;
      before = after;
    }
    report.push({name: 'step', values: n, changed, ms, disabled: false});
  }
  fx.set(P.init, 0);
  return report;
})()
"""


def _sample_js(uid: str, seed: int) -> str:
    """JavaScript that moves explorer ``uid`` to a pseudo-random grid state and step (from
    ``seed``) and returns what the page shows: the control values, the step, the numbers."""
    return (f"(() => {{ const root = document.getElementById({json.dumps(uid)}), fx = root.fx, P = fx.payload;"
            f" let x = {int(seed)} * 2654435761 % 4294967296;"
            " const next = m => { x = (x * 1103515245 + 12345) % 2147483648; return x % m; };"
            " const idx = P.controls.map(c => next(c.values.length));"
            " let k = 0; P.controls.forEach((c, n) => { k = k * c.values.length + idx[n]; });"
            " const st = P.states[P.lookup[k]];"
            " const frame = st.frames ? next(st.frames.length) : 0;"
            " fx.set(idx, frame); root.scrollIntoView({block: 'start'});"
            " const cur = fx.current();"
            " return {values: cur.values, frame: cur.frame,"
            " lines: [...fx.numbers.children].map(d => d.textContent)}; })()")


def python_numbers(kind: str, args: dict, values: dict, frame: int) -> list[str]:
    """The numbers explorer ``kind`` (built with ``args``) prints for ``values`` and ``frame``,
    computed by the package's Python code."""
    return _explorer(kind, json.dumps(args, sort_keys=True)).numbers(values, frame)


@functools.lru_cache(maxsize=None)
def _explorer(kind: str, args_json: str):
    from flashlab.widgets.explorer import EXPLORERS, Explorer

    cls = EXPLORERS[kind]
    ex = cls.__new__(cls)
    Explorer.__init__(ex, **json.loads(args_json))
    return ex


def explorer_problems(report: dict) -> list[str]:
    """What is wrong with one explorer, from the measurements of :func:`check_explorers`."""
    from flashlab.widgets.explorer import MAX_PAYLOAD_BYTES

    name = f"explorer {report['kind']} ({report['id']})"
    out = []
    if not report["ready"]:
        return [f"{name}: never became interactive (no data decoded)"]
    if report["bytes"] > MAX_PAYLOAD_BYTES:
        out.append(f"{name}: adds {report['bytes']:,} bytes to the page, over {MAX_PAYLOAD_BYTES:,}")
    if report["interactive_ms"] > READY_LIMIT_MS:
        out.append(f"{name}: interactive {report['interactive_ms']:.0f} ms after load, over {READY_LIMIT_MS:.0f}")
    for c in report["controls"]:
        if not c["changed"]:
            out.append(f"{name}: control {c['name']!r} does nothing (moved through its {c['values']} values)")
        if c["ms"] and max(c["ms"]) > RESPONSE_LIMIT_MS:
            out.append(f"{name}: control {c['name']!r} took {max(c['ms']):.1f} ms to respond, "
                       f"over {RESPONSE_LIMIT_MS:.0f}")
    for s in report["samples"]:
        if s["page"] != s["python"]:
            out.append(f"{name}: at {s['values']} step {s['frame']} the page shows {s['page']} "
                       f"but Python computes {s['python']}")
    return out


def check_explorers(cdp: CDP, session: str, shot: Path) -> tuple[list[str], list[dict]]:
    """Check every static explorer of the open page (see the module's docstring); screenshots
    ``<page>-explorer<n>-<k>.png``. Returns ``(problems, reports)``."""
    evaluate = functools.partial(cdp.send, "Runtime.evaluate", session=session)
    for old in shot.parent.glob(f"{shot.stem}-explorer*{shot.suffix}"):
        old.unlink()
    deadline = time.monotonic() + 20
    while True:
        found = evaluate({"expression": EXPLORERS_JS, "returnByValue": True})["result"]["value"]
        if all(e["ready"] for e in found) or time.monotonic() > deadline:
            break
        cdp.drain(0.2)
    problems, reports = [], []
    for n, e in enumerate(found, 1):
        report = {**e, "controls": [], "samples": [],
                  "interactive_ms": max(0.0, (e["readyMs"] or 0) - e["loadMs"]),
                  "own_ms": (e["readyMs"] or 0) - (e["bootMs"] or 0)}
        if e["ready"]:
            report["controls"] = evaluate({"expression": MOVE_JS % json.dumps(e["id"]),
                                           "returnByValue": True})["result"]["value"]
            for k in range(1, SAMPLES + 1):
                shown = evaluate({"expression": _sample_js(e["id"], 1000 * n + k),
                                  "returnByValue": True})["result"]["value"]
                report["samples"].append({**shown, "page": shown["lines"],
                                          "python": python_numbers(e["kind"], e["args"], shown["values"],
                                                                   shown["frame"])})
                box = evaluate({"expression": f"(() => {{ const r = document.getElementById({json.dumps(e['id'])})"
                                ".getBoundingClientRect(); return {x: r.left + scrollX, y: r.top + scrollY, "
                                "width: r.width, height: r.height}; })()", "returnByValue": True})["result"]["value"]
                clip = element_clip(box)
                if clip:
                    png = cdp.send("Page.captureScreenshot", {"format": "png", "clip": clip}, session=session)["data"]
                    shot.with_name(f"{shot.stem}-explorer{n}-{k}{shot.suffix}").write_bytes(base64.b64decode(png))
            evaluate({"expression": f"document.getElementById({json.dumps(e['id'])}).fx.set("
                                    f"document.getElementById({json.dumps(e['id'])}).fx.payload.init, 0)"})
        problems += explorer_problems(report)
        reports.append(report)
    return problems, reports


def check_explorer_file(html: Path, chromium: str, shots: Path) -> tuple[list[str], list[dict]]:
    """Open one HTML file (served from its folder, network off) in headless Chromium and run
    :func:`check_explorers` on it: the explorers' check without a built book (the tests use it
    on a page of the four explorers)."""
    server, port = _serve(html.parent)
    shots.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="check-explorers-") as profile:
        proc, ws_url = _launch_chromium(chromium, Path(profile))
        try:
            cdp = CDP(ws_url)
            target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                cdp.send(f"{domain}.enable", session=session)
            cdp.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
            cdp.send("Page.navigate", {"url": f"http://127.0.0.1:{port}/{html.name}"}, session=session)
            if not cdp.wait_event("Page.loadEventFired", session, 60):
                return [f"{html.name} did not finish loading in 60 s"], []
            cdp.drain(0.5)
            problems, reports = check_explorers(cdp, session, shots / f"{html.stem}.png")
            errors = [e for e in _event_errors(cdp.events, session) if "favicon.ico" not in e]
            return problems + errors, reports
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            server.shutdown()


def explorer_line(report: dict) -> str:
    """One printed line per explorer: size, readiness, response times, samples."""
    times = sorted(t for c in report["controls"] for t in c["ms"])
    worst = f"{times[-1]:.1f}" if times else "-"
    median = f"{times[len(times) // 2]:.1f}" if times else "-"
    same = sum(s["page"] == s["python"] for s in report["samples"])
    moved = sum(c["changed"] for c in report["controls"])
    ready = f"{report['readyMs']:.0f}" if report.get("readyMs") is not None else "-"
    return (f"    explorer {report['kind']:<9} {report['bytes'] / 1e6:5.2f} MB, ready {ready} ms after "
            f"navigation start ({report.get('own_ms', 0):.0f} ms from its script, the page loading "
            f"meanwhile), interactive {report['interactive_ms']:.0f} ms after the load event, "
            f"{moved}/{len(report['controls'])} controls "
            f"change the picture, response median {median} ms, max {worst} ms; "
            f"{same}/{len(report['samples'])} sampled states match Python")



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", type=Path, default=ROOT / "_build" / "html")
    ap.add_argument("--screenshots", type=Path, default=ROOT / "_build" / "screenshots")
    ap.add_argument("--only", default="", help="comma-separated page names (default: every TOC page)")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds to let scripts render after load (then it polls up to 20 s more)")
    ap.add_argument("--max-height", type=int, default=6000, help="screenshot height cap in pixels")
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser")
                    or shutil.which("google-chrome"))
    args = ap.parse_args(argv)
    if not args.chromium:
        print("check-site: chromium not found (apt-get install chromium)", file=sys.stderr)
        return 2
    if not (args.html / "index.html").exists():
        print(f"check-site: no built site at {args.html} (run make book)", file=sys.stderr)
        return 2
    pages = toc_pages(ROOT / "_toc.yml")
    if args.only:
        pages = [p for p in pages if Path(p).name in args.only.split(",")]
    args.screenshots.mkdir(parents=True, exist_ok=True)
    report: dict[str, list[str]] = {"(links)": check_links(args.html)}
    server, port = _serve(args.html)
    with tempfile.TemporaryDirectory(prefix="check-site-") as profile:
        proc, ws_url = _launch_chromium(args.chromium, Path(profile))
        try:
            cdp = CDP(ws_url)
            for page in pages:
                notebook = (ROOT / f"{page}.ipynb").exists()
                shot = args.screenshots / f"{Path(page).name}.png"
                t0 = time.monotonic()
                n_reports = len(EXPLORER_REPORTS)
                report[page] = check_page(cdp, f"http://127.0.0.1:{port}/{page}.html", shot,
                                          notebook=notebook, settle=args.settle, max_height=args.max_height)
                status = "ok" if not report[page] else f"{len(report[page])} problem(s)"
                n_elements = sum(1 for p in shot.parent.glob(f"{shot.stem}-*{shot.suffix}")
                                 if p.stem.removeprefix(f"{shot.stem}-").isdigit())
                more = f" (+{n_elements} element shots {shot.stem}-1..{n_elements})" if n_elements else ""
                print(f"  {page:<32} {status:<14} {time.monotonic() - t0:4.1f} s  -> "
                      f"{shot.relative_to(ROOT) if shot.is_relative_to(ROOT) else shot}{more}")
                for r in EXPLORER_REPORTS[n_reports:]:
                    print(explorer_line(r))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            server.shutdown()
    bad = {k: v for k, v in report.items() if v}
    for page, problems in bad.items():
        print(f"\n{page}:")
        for p in problems:
            print(f"  - {p}")
    n_pages = len(pages)
    print(f"\ncheck-site: {n_pages} pages, {sum(map(len, bad.values()))} problems"
          + ("" if bad else " - OK"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
