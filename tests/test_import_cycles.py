"""No import cycles in product code: no two modules import each other, directly or
through others, at module level (imports inside functions and under ``TYPE_CHECKING``
do not count: they run after both modules exist)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = ("localstate.benchmarks", "localstate.testing")  # tools, not the product's import graph


def _modules() -> dict[str, Path]:
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for package, source in mapping.items():
        for path in (ROOT / source).glob("*.py"):
            found[package if path.name == "__init__.py" else f"{package}.{path.stem}"] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if not isinstance(node, (ast.Import, ast.ImportFrom, ast.If, ast.Try)):
            continue
        for n in ast.walk(node):
            if isinstance(n, ast.ImportFrom):
                base = ".".join(package[:len(package) - n.level + 1] + ([n.module] if n.module else [])) if n.level \
                    else (n.module or "")
                out |= {c for c in (base, *(f"{base}.{a.name}" for a in n.names)) if c in known}
            elif isinstance(n, ast.Import):
                out |= {a.name for a in n.names if a.name in known}
    return out


def test_no_import_cycles_in_product_code() -> None:
    known = _modules()
    graph = {m: _imports(m, p, known) for m, p in known.items() if not m.startswith(SKIPPED)}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if target not in graph:
                continue
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
