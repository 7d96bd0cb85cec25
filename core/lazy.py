"""Public names of a package imported on first use (PEP 562), for packages that a
process may import only on its way to one submodule — Spark's streaming-source runner,
a fresh interpreter at every query start, imports ``localstate``,
``localstate.contrib.spark`` and ``localstate.contrib.spark.sources`` to unpickle one
source, and every eager import there is paid at each query start."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: a name of
    ``where`` is imported from its (relative) module on first access and kept in the
    package; any other missing name is an ``AttributeError``::

        __getattr__, __dir__ = lazy_exports(__name__, {"TaskStorage": ".storage"})
    """
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        source = where.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(source, package), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *getattr(module, "__all__", ())})

    return __getattr__, __dir__
