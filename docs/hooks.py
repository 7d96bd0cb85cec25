"""MkDocs hooks: publish the top-level Markdown files that live outside docs/, list every
tutorial page, lay out the package for the API reference, and write the command-line
reference from the commands' own ``--help``.

RELIABILITY.md, CHANGELOG.md and benchmarks/RESULTS.md (with its charts) stay where
the code and the tests that produce them are; the site reads them from there instead
of keeping a second copy that would drift.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

# repository file -> its place in the site
PUBLISHED = {
    "RELIABILITY.md": "reliability.md",
    "CHANGELOG.md": "changelog.md",
    "benchmarks/RESULTS.md": "benchmarks/index.md",
    "benchmarks/HISTORY.md": "benchmarks/history.md",
}
CHART_DIR = "benchmarks/results"  # images RESULTS.md shows, as results/<name>.png


TUTORIALS = "Tutorial"  # the nav section that lists tutorial.md and every tutorial-*.md


PACKAGE_TREE = ROOT / ".api-packages"  # read by mkdocstrings (mkdocs.yml: paths)


def _package_tree() -> None:
    """Lay out ``localstate`` as the wheel has it (core/ is ``localstate``, contrib/ is
    ``localstate.contrib``, ...), modules linked from the source, from pyproject.toml's
    ``package-dir``: the API reference then reads the source statically. (An editable
    install maps only the top package and hides the rest from mkdocstrings.)"""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(PACKAGE_TREE, ignore_errors=True)
    for package, source in sorted(mapping.items()):
        target = PACKAGE_TREE.joinpath(*package.split("."))
        target.mkdir(parents=True, exist_ok=True)
        for module in (ROOT / source).glob("*.py"):  # files only: griffe skips linked dirs,
            target.joinpath(module.name).symlink_to(module)  # and every package is mapped


def on_startup(command: str, dirty: bool) -> None:
    """Build the package tree for the API reference before any plugin is configured:
    mkdocstrings drops search paths that do not exist yet when it sets up."""
    _package_tree()


MORE = "More"  # the nav section for pages in docs/ that mkdocs.yml does not place yet


def _listed(nav: Any) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(_listed(v) for v in nav.values()))
    if isinstance(nav, list):
        return set().union(*(_listed(v) for v in nav))
    return set()


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Add each ``docs/tutorial-*.md`` to the Tutorial section, and any other page of
    docs/ that the nav does not list to a last "More" section: a page added in parallel
    work is published (and crawled by tests/test_docs_site.py) before someone gives it
    its place in mkdocs.yml."""
    docs = Path(config["docs_dir"])
    for entry in config["nav"]:
        if isinstance(entry, dict) and TUTORIALS in entry:
            pages = entry[TUTORIALS]
            pages.extend(p.name for p in sorted(docs.glob("tutorial-*.md")) if p.name not in pages)
    listed = _listed(config["nav"]) | set(PUBLISHED.values())
    pages = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md"))
    unplaced = [page for page in pages if page not in listed]
    if unplaced:
        config["nav"].append({MORE: unplaced})
    return config


CLI_REFERENCE = "<!-- cli-reference -->"  # replaced in cli.md by every command's --help
HELP_WIDTH = 88


def _cli_reference() -> str:
    """Each command's ``--help`` text, as ``localstate <command> --help`` prints it."""
    import click
    from localstate.cli import cli

    root = click.Context(cli, info_name="localstate", terminal_width=HELP_WIDTH, max_content_width=HELP_WIDTH)
    parts = [f"### localstate\n\n```text\n{cli.get_help(root)}\n```\n"]
    for name in cli.list_commands(root):
        command = cli.get_command(root, name)
        if command is None:
            continue
        ctx = click.Context(command, info_name=name, parent=root, terminal_width=HELP_WIDTH,
                            max_content_width=HELP_WIDTH)
        parts.append(f"### localstate {name}\n\n```text\n{command.get_help(ctx)}\n```\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, config: MkDocsConfig, files: Files) -> str:
    if CLI_REFERENCE in markdown:
        markdown = markdown.replace(CLI_REFERENCE, _cli_reference())
    return markdown


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for source, uri in PUBLISHED.items():
        files.append(File.generated(config, uri, abs_src_path=str(ROOT / source)))
    for chart in sorted((ROOT / CHART_DIR).glob("*.png")):
        files.append(File.generated(config, f"{CHART_DIR}/{chart.name}", abs_src_path=str(chart)))
    return files
