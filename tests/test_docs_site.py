"""The documentation site: ``mkdocs build --strict`` passes, and every page, link, image
and anchor of the built site works when a real browser loads it.

The site is served on 127.0.0.1 and crawled from its home page with headless Chromium
(Debian's ``chromium``; ``.ci/run`` installs it): each page is rendered with
``--dump-dom`` (after the theme's JavaScript ran), its links, images, stylesheets and
scripts are collected, and every internal one must exist — pages are rendered in turn,
other files fetched. The server records every request, including those the browser
made itself (the search index, fonts, icons), and any 404 fails the test. Every
Markdown page under docs/ must be reached from the home page.

The same rendering checks what a reader sees: the server adds a small script to every
page (``PROBE``) that measures, in the laid-out page, that no SVG diagram's text runs
outside its viewBox (SVG images are fetched and measured too) and that no diagram drawn
in text needs a scroll bar at a desktop window size; and no page may mention the
project's internal issue numbers.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urldefrag, urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
WINDOW = (1280, 900)  # a laptop screen: both of the theme's side bars are shown
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", f"--window-size={WINDOW[0]},{WINDOW[1]}"]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed: .ci/run installs it with apt-get install -y chromium")
    pytest.skip("chromium is not installed (apt-get install chromium); CI always runs this test")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # python -m mkdocs: the console script would put .venv/bin first on sys.path, where
    # mkdocstrings then finds the `localstate` script instead of the package.
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    assert "WARNING" not in result.stderr, result.stderr[-5000:]
    return out


PROBE_RESULT = "localstate-probe"
PROBE = r"""<script>
(() => {
  // Text diagrams: box-drawing characters and arrows mark a diagram drawn in a code block.
  const DIAGRAM = /[\u2500-\u257f\u2190-\u21ff\u25b2-\u25c4]/;
  const problems = [];
  function measure(svg, label) {
    if (!svg.querySelector("text")) return;  // icons: no text to clip
    const vb = svg.viewBox.baseVal;
    const [x0, y0] = vb && vb.width ? [vb.x, vb.y] : [0, 0];
    const [x1, y1] = vb && vb.width ? [vb.x + vb.width, vb.y + vb.height]
                                    : [svg.width.baseVal.value, svg.height.baseVal.value];
    const toSvg = svg.getScreenCTM().inverse();
    for (const text of svg.querySelectorAll("text")) {
      // An SVG's fonts are the reader's: measured as this browser picks them, and in
      // DejaVu Sans, the wide sans-serif of Linux desktops without Helvetica or Arial.
      const boxes = [text.getBBox()];
      const family = text.style.fontFamily;
      text.style.fontFamily = '"DejaVu Sans", sans-serif';
      boxes.push(text.getBBox());
      text.style.fontFamily = family;
      const m = toSvg.multiply(text.getScreenCTM());
      const pts = boxes.flatMap(b => [[b.x, b.y], [b.x + b.width, b.y], [b.x, b.y + b.height], [b.x + b.width, b.y + b.height]])
        .map(([x, y]) => new DOMPoint(x, y).matrixTransform(m));
      const xs = pts.map(p => p.x), ys = pts.map(p => p.y);
      const [left, right, top, bottom] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
      if (left < x0 - 0.5 || right > x1 + 0.5 || top < y0 - 0.5 || bottom > y1 + 0.5) {
        problems.push(`${label}: the text "${text.textContent.trim()}" spans x ${left.toFixed(0)}..${right.toFixed(0)}, ` +
                      `y ${top.toFixed(0)}..${bottom.toFixed(0)}, outside the viewBox ${x0} ${y0} ${x1} ${y1}: it is clipped`);
      }
    }
  }
  const shelf = document.createElement("div");  // laid out, not shown: SVG images measured here
  shelf.style.cssText = "position:absolute;left:-20000px;top:0;visibility:hidden";
  document.body.appendChild(shelf);
  for (const img of document.querySelectorAll("img")) {
    const src = img.getAttribute("src") || "";
    if (!src.split(/[?#]/)[0].endsWith(".svg")) continue;
    const request = new XMLHttpRequest();
    request.open("GET", img.src, false);
    request.send();
    const svg = new DOMParser().parseFromString(request.responseText, "image/svg+xml").documentElement;
    if (svg.nodeName !== "svg") { problems.push(`${src}: not an SVG document`); continue; }
    shelf.appendChild(document.importNode(svg, true));
    measure(shelf.lastElementChild, src);
  }
  document.querySelectorAll("svg").forEach((svg, i) => {
    if (!shelf.contains(svg)) measure(svg, `inline SVG #${i + 1}`);
  });
  for (const pre of document.querySelectorAll("pre")) {
    if (pre.querySelector("code span[class]")) continue;  // highlighted code: an arrow in a comment is no diagram
    if (!DIAGRAM.test(pre.textContent)) continue;
    for (const box of [pre, pre.querySelector("code")]) {
      if (box && box.scrollWidth > box.clientWidth + 1) {
        const first = pre.textContent.trim().split("\n")[0].slice(0, 60);
        problems.push(`the text diagram starting "${first}" is ${box.scrollWidth}px wide in a ` +
                      `${box.clientWidth}px box (window ${window.innerWidth}px): it scrolls, cut at the right edge`);
        break;
      }
    }
  }
  shelf.remove();
  const out = document.createElement("pre");
  out.id = "@PROBE_RESULT@";
  out.hidden = true;
  out.textContent = JSON.stringify(problems);
  document.body.appendChild(out);
})();
</script>
""".replace("@PROBE_RESULT@", PROBE_RESULT)
"""Added to every page the browser renders (before ``</body>``, after the theme's scripts):
what it finds is written into the page as JSON, read back from the dumped DOM."""

INTERNAL_ISSUE = re.compile(r"\bissues?\s+#?\d+|\(#\d+\)|\bpart \d+ of issue", re.I)
"""A reference to the project's own issue tracker, which readers of the site do not see."""


class _Recorder(SimpleHTTPRequestHandler):
    requests: list[tuple[str, int]]

    def send_head(self) -> BinaryIO | BytesIO | None:
        """Pages get ``PROBE`` (one without ``</body>`` goes unprobed, and the test names
        it); everything else is served as it is."""
        path = urlsplit(self.path).path
        file = Path(self.translate_path(path))
        if path.endswith("/"):
            file = file / "index.html"
        if not (_is_page(path) and file.is_file()):
            return super().send_head()
        html = file.read_text(encoding="utf-8")
        body = html.replace("</body>", PROBE + "</body>", 1).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return BytesIO(body)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.requests.append((self.path, int(code) if isinstance(code, int) or str(code).isdigit() else 0))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    requests: list[tuple[str, int]] = []
    handler = type("Handler", (_Recorder,), {"requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requests
    finally:
        server.shutdown()
        server.server_close()


class _Page(HTMLParser):
    """Links, resources and element ids of one rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.resources: list[str] = []
        self.ids: set[str] = set()
        self.headings = 0
        self.text: list[str] = []  # what a reader sees (no scripts, styles or the probe)
        self.probe: str | None = None
        self._skip: str | None = None  # inside this element, text is not the page's

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag in ("script", "style") or a.get("id") == PROBE_RESULT:
            self._skip = PROBE_RESULT if a.get("id") == PROBE_RESULT else tag
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        elif tag in ("img", "script") and a.get("src"):
            self.resources.append(a["src"])
        elif tag == "link" and a.get("href") and a.get("rel") in ("stylesheet", "icon", "shortcut icon"):
            self.resources.append(a["href"])
        if tag == "h1":
            self.headings += 1

    def handle_endtag(self, tag: str) -> None:
        if self._skip is not None and tag == ("pre" if self._skip == PROBE_RESULT else self._skip):
            self._skip = None

    def handle_data(self, data: str) -> None:
        if self._skip == PROBE_RESULT:
            self.probe = (self.probe or "") + data
        elif self._skip is None:
            self.text.append(data)


def _render(chromium: str, url: str, profile: Path) -> str:
    result = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"chromium could not render {url}: {result.stderr[-2000:]}"
    return result.stdout


def _is_page(path: str) -> bool:
    return path.endswith("/") or path.endswith(".html")


def _docs_pages() -> dict[str, str]:
    """Every Markdown page under docs/ → its path in the site (``a/b.md`` → ``/a/b/``)."""
    docs = ROOT / "docs"
    out = {}
    for page in sorted(docs.rglob("*.md")):
        rel = page.relative_to(docs).with_suffix("")
        out[rel.as_posix() + ".md"] = "/" if rel.as_posix() == "index" else f"/{rel.as_posix()}/"
    return out


def test_the_site_builds_in_strict_mode_with_every_docs_page(site: Path) -> None:
    for page, path in _docs_pages().items():
        built = site / path.strip("/") / "index.html"
        assert built.is_file(), f"docs/{page} was not built into the site"
    for published in ("reliability/index.html", "changelog/index.html", "benchmarks/index.html", "api/index.html"):
        assert (site / published).is_file(), published
    api = (site / "api" / "index.html").read_text()
    for name in ("TaskStorage", "StatefulJob", "StorageEngine", "KeyValueStoreConformance"):
        assert name in api, f"the API reference lacks {name}"
    # what a user calls, rendered as an entry of its own (inherited methods included)
    for entry in ("localstate.TaskStorage.commit", "localstate.TaskStorage.store", "localstate.StateReader",
                  "localstate.read_committed", "localstate.timers.Timers", "localstate.timers.Timers.register",
                  "localstate.rescale.rescale", "localstate.rescale.RescaleResult", "localstate.prometheus.register",
                  "localstate.prometheus.register_spark_job"):
        assert f'id="{entry}"' in api, f"the API reference has no entry {entry}"


def test_every_page_link_image_and_anchor_works_in_chromium(served: tuple[str, list[tuple[str, int]]],
                                                            tmp_path: Path) -> None:
    chromium = _chromium()
    base, requests = served
    host = urlsplit(base).netloc
    pages: dict[str, _Page] = {}
    queue = [base]
    anchors: list[tuple[str, str, str]] = []  # (from page, target page, fragment)
    broken: list[str] = []
    checked_files: set[str] = set()
    while queue:
        url = queue.pop()
        if url in pages:
            continue
        page = _Page()
        page.feed(_render(chromium, url, tmp_path / "profile"))
        pages[url] = page
        if page.headings == 0:
            broken.append(f"{url}: rendered without a heading (empty or missing page)")
        for ref in page.links + page.resources:
            target, fragment = urldefrag(urljoin(url, ref))
            parts = urlsplit(target)
            if parts.scheme not in ("http", "https") or parts.netloc != host:
                continue  # external links: no network here; mailto etc.
            if fragment:
                anchors.append((url, target, fragment))
            if _is_page(parts.path):
                if target not in pages:
                    queue.append(target)
            elif target not in checked_files:
                checked_files.add(target)
                try:
                    with urllib.request.urlopen(target, timeout=30) as response:
                        assert response.status == 200
                except urllib.error.HTTPError as e:
                    broken.append(f"{url}: {ref} -> HTTP {e.code}")
    for source, target, fragment in anchors:
        if target in pages and fragment not in pages[target].ids:
            broken.append(f"{source}: link to {target}#{fragment}, but that page has no such anchor")
    missing = sorted({path for path, status in requests if status >= 400})
    assert not missing, f"the browser or the crawl requested files that do not exist: {missing}"
    assert not broken, "broken links:\n" + "\n".join(broken)
    reached = {urlsplit(u).path for u in pages}
    for page, path in _docs_pages().items():
        assert path in reached, f"docs/{page} is not reachable from the home page"
    for path in ("/reliability/", "/benchmarks/", "/api/", "/changelog/"):
        assert path in reached, path

    unmeasured = [url for url, page in pages.items() if page.probe is None]
    assert not unmeasured, f"the probe did not run on {unmeasured}"
    clipped = [f"{url}: {problem}" for url, page in sorted(pages.items())
               for problem in json.loads(page.probe or "[]")]
    internal = [f"{url}: ...{m.string[max(0, m.start() - 50):m.end() + 30]}..."
                for url, page in sorted(pages.items())
                for m in INTERNAL_ISSUE.finditer(" ".join("".join(page.text).split()))]
    assert not (clipped or internal), "\n".join(
        (["diagrams that do not fit their box:", *clipped] if clipped else [])
        + (["pages mention internal issue numbers (say what, not which ticket):", *internal] if internal else []))


def test_the_cli_reference_shows_every_command(site: Path) -> None:
    import click
    from localstate.cli import cli

    page = (site / "cli" / "index.html").read_text()
    for name in cli.list_commands(click.Context(cli)):
        assert f"Usage: localstate {name}" in page, f"the CLI reference lacks 'localstate {name}'"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """The README promises that its second command is what CI runs."""
    from tests.test_docs_install import SUITE_COMMAND_END

    readme = (ROOT / "README.md").read_text()
    commands = [line.strip() for line in readme.splitlines() if line.startswith("    python3 -m venv .venv")
                and line.rstrip().endswith(("localstate demo", SUITE_COMMAND_END))]
    assert len(commands) == 2, commands
    demo, suite = commands
    assert demo.endswith("&& .venv/bin/localstate demo")
    assert suite.endswith(f"&& .venv/bin/python -m {SUITE_COMMAND_END}")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert suite in ci, f".ci/run must run the README's test command verbatim: {suite}"
