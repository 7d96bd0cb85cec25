"""No product module grows past ~600 lines: one that does is split by concern into modules
with explicit interfaces (docs/architecture.md maps them), never cut by line count.

``LONGER`` names the modules still over the limit, each with what it holds; split one and
drop it from the list (the second test fails until it is dropped)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("core", "changelog", "engines", "contrib", "benchmarks")
LIMIT = 600

LONGER: dict[str, str] = {}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _product_modules() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py") if ".venv" not in p.parts)


def test_no_product_module_is_over_the_limit() -> None:
    modules = _product_modules()
    assert len(modules) > 100, "the product's modules are found"
    over = [f"{p.relative_to(ROOT)}: {n} lines" for p in modules
            if (n := _lines(p)) > LIMIT and str(p.relative_to(ROOT)) not in LONGER]
    assert not over, (f"product modules over {LIMIT} lines; split each by concern (docs/architecture.md):\n"
                      + "\n".join(over))


def test_the_list_of_longer_modules_is_current() -> None:
    stale = [m for m in LONGER if not (ROOT / m).is_file() or _lines(ROOT / m) <= LIMIT]
    assert not stale, f"these modules are {LIMIT} lines or fewer now (or gone): drop them from LONGER: {stale}"
