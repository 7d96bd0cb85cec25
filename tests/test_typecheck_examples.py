"""mypy on every Python example of README.md and docs/*.md: the typed API a user sees
(``KeyValueStore[K, V]``, ``storage.store(name, K, V)``, the mapping methods) is
what their type checker sees, and the examples are clean under it.

The source tree maps folders onto the ``localstate`` package (pyproject's
``package-dir``), which setuptools' default editable mode hides from mypy behind an
import hook (the documented install uses ``editable_mode=strict``, which mypy sees:
tests/test_docs_install.py); so that this test does not depend on how the suite's own
environment was installed, it lays the package out as an installed wheel would
(symlinks, from the same ``package-dir`` table) and points ``MYPYPATH`` at it. Errors
inside localstate itself are not this test's subject (``--follow-imports=silent``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

pytest.importorskip("mypy")


def _docs_examples() -> object:
    """tests/test_docs_examples.py, the one home of "which blocks are examples"
    (pytest's importlib mode puts no test directory on sys.path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_docs_examples", Path(__file__).with_name("test_docs_examples.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_DOCS = _docs_examples()
BLOCKS, ROOT = _DOCS.BLOCKS, _DOCS.ROOT  # type: ignore[attr-defined]


EXCERPTS = {"custom-engines.md"}
"""Pages whose blocks are pieces of one engine (a method naming the page's module
constants, a test naming its engine class): checked except for names defined elsewhere."""


def _package_tree(into: Path) -> Path:
    """``into/localstate/...`` as a wheel lays it out, from pyproject's package-dir."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items()):
        target = into / package.replace(".", "/")
        target.mkdir(parents=True, exist_ok=True)
        for entry in (ROOT / folder).iterdir():
            if entry.name == "__pycache__" or (target / entry.name).exists():
                continue
            if entry.is_dir() and f"{package}.{entry.name}" in mapping:
                continue  # a subpackage of its own: laid out from its own entry
            (target / entry.name).symlink_to(entry)
    return into


def test_examples_type_check(tmp_path: Path) -> None:
    assert (ROOT / "core" / "py.typed").exists(), "the package must ship py.typed"
    packages = _package_tree(tmp_path / "site")
    files = []
    for i, block in enumerate(BLOCKS):
        doc, line, code, fragment = block.values
        if fragment:
            continue  # names the reader's own code; only compiled (test_docs_examples)
        if doc in EXCERPTS:
            code = '# mypy: disable-error-code="name-defined"\n' + code
        path = tmp_path / "examples" / f"ex{i:02d}_{Path(doc).stem.replace('-', '_')}_{line}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(code)
        files.append(str(path))
    assert len(files) >= 6
    env = dict(os.environ, MYPYPATH=str(packages))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports",
         "--check-untyped-defs", "--no-error-summary", "--cache-dir", str(ROOT / ".pytest_cache" / "mypy"),
         *files],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert result.returncode == 0, f"mypy found problems in the examples:\n{result.stdout}{result.stderr}"
