"""The documentation site: ``mkdocs build --strict`` passes, and every page, link, image
and anchor of the built site works when a real browser loads it.

The site is served on 127.0.0.1 and crawled from its home page with headless Chromium
(Debian's ``chromium``; ``.ci/run`` installs it): each page is rendered with
``--dump-dom`` (after the theme's JavaScript ran), its links, images, stylesheets and
scripts are collected, and every internal one must exist — pages are rendered in turn,
other files fetched. The server records every request, including those the browser
made itself (the search index, fonts, icons), and any 404 fails the test. Every
Markdown page under docs/ must be reached from the home page.
"""

from __future__ import annotations

import os
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
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


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


class _Recorder(SimpleHTTPRequestHandler):
    requests: list[tuple[str, int]]

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

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        elif tag in ("img", "script") and a.get("src"):
            self.resources.append(a["src"])
        elif tag == "link" and a.get("href") and a.get("rel") in ("stylesheet", "icon", "shortcut icon"):
            self.resources.append(a["href"])
        if tag == "h1":
            self.headings += 1


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


def test_the_cli_reference_shows_every_command(site: Path) -> None:
    import click
    from localstate.cli import cli

    page = (site / "cli" / "index.html").read_text()
    for name in cli.list_commands(click.Context(cli)):
        assert f"Usage: localstate {name}" in page, f"the CLI reference lacks 'localstate {name}'"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """The README promises that its second command is what CI runs."""
    readme = (ROOT / "README.md").read_text()
    commands = [line.strip() for line in readme.splitlines() if line.startswith("    python3 -m venv .venv")]
    assert len(commands) == 2, commands
    demo, suite = commands
    assert demo.endswith("&& .venv/bin/localstate demo")
    assert suite.endswith("&& .venv/bin/python -m pytest -q")
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert suite in ci, f".ci/run must run the README's test command verbatim: {suite}"
