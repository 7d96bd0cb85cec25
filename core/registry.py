"""Picking implementations by name: engines, serdes and changelog systems.

Each registry maps a name to either an object or a lazily imported
``"package.module:attr"`` string with an install hint, plus the third-party
entry-point group. ``"module:attr"`` is also accepted directly wherever a name is.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from .errors import (
    ConfigError,
    EngineError,
    LocalStateError,
    UnknownEngineError,
    UnknownSystemError,
)

__all__ = [
    "Registry",
    "ENGINES",
    "SYSTEMS",
    "register_engine",
    "register_system",
    "available",
    "resolve_factory",
    "did_you_mean",
]


def did_you_mean(name: str, choices: Any) -> str:
    """``" Did you mean 'x'?"`` or ``" Valid names: a, b."``"""
    choices = sorted(choices)
    close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    if close:
        return f" Did you mean {close[0]!r}?"
    return f" Valid names: {', '.join(choices)}." if choices else ""


@dataclass(frozen=True)
class _Entry:
    target: Any  # an object, or a "module:attr" string imported on first use
    extra: str | None = None  # the localstate extra that provides its dependencies
    origin: str = "built-in"


def import_path(path: str) -> Any:
    """Import ``"package.module:attr"`` (``attr`` may be dotted)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{path!r} is not a 'package.module:attr' path")
    module = importlib.import_module(module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Registry:
    """A named set of implementations with lazy imports and an entry-point group."""

    def __init__(self, kind: str, group: str, error: type[ConfigError]) -> None:
        self.kind = kind
        self.group = group
        self._error = error
        self._entries: dict[str, _Entry] = {}
        self._loaded: dict[str, Any] = {}
        self._entry_points_scanned = False
        self._conflicts: dict[str, str] = {}  # name -> why it cannot be used (two claimants)
        self._lock = threading.RLock()

    def register(
        self,
        name: str,
        target: Any,
        *,
        clobber: bool = False,
        extra: str | None = None,
        origin: str = "user",
    ) -> None:
        """Register ``target`` (an object or ``"module:attr"``) under ``name``.

        Registering a taken name raises :class:`ConfigError` unless ``clobber``.
        """
        with self._lock:
            self._scan_entry_points()
            old = self._entries.get(name)
            if old is not None and not clobber and old.target is not target and old.origin.startswith("entry point"):
                # an installed plug-in claims a name registered here too: only that name is
                # unusable (reported when used), everything else keeps working
                self._conflicts[name] = self._conflict_message(name, old.origin, origin)
                return
            if old is not None and not clobber and old.target is not target:
                raise ConfigError(
                    f"{self.kind} name {name!r} is already registered by {old.origin} "
                    f"({_describe(old.target)}); pass clobber=True to replace it or pick another name"
                )
            self._entries[name] = _Entry(target, extra, origin)
            self._loaded.pop(name, None)
            if clobber:
                self._conflicts.pop(name, None)

    def _conflict_message(self, name: str, first: str, second: str) -> str:
        return (
            f"two {self.kind}s claim the name {name!r}: {first} and {second}. Uninstall one, or "
            f"register one under another name (other {self.kind}s are unaffected)"
        )

    def unregister(self, name: str) -> None:
        """Forget ``name`` (absent names are ignored)."""
        with self._lock:
            self._entries.pop(name, None)
            self._loaded.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            self._scan_entry_points()
            return sorted(self._entries)

    def view(self) -> Mapping[str, _Entry]:
        with self._lock:
            self._scan_entry_points()
            return MappingProxyType(self._entries)

    def get(self, name: str, *, store: str | None = None) -> Any:
        """The implementation registered as ``name`` (or at ``"module:attr"``)."""
        where = f"store {store!r}: " if store else ""
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            self._scan_entry_points()
            conflict = self._conflicts.get(name)
            if conflict is not None:
                raise EngineError(f"{where}{conflict}")
            entry = self._entries.get(name)
            if entry is None:
                if ":" in name:
                    entry = _Entry(name, None, "path")
                else:
                    raise self._error(
                        f"{where}unknown {self.kind} {name!r}.{did_you_mean(name, self._entries)}"
                    )
            obj = self._load(name, entry, where)
            self._loaded[name] = obj
            return obj

    def installed(self, name: str) -> tuple[bool, str]:
        """Whether ``name`` loads, and why not (the install hint)."""
        try:
            self.get(name)
            return True, ""
        except LocalStateError as e:  # missing extra, broken plug-in, name conflict
            return False, str(e)

    def _load(self, name: str, entry: _Entry, where: str) -> Any:
        if not isinstance(entry.target, str):
            return entry.target
        try:
            return import_path(entry.target)
        except ModuleNotFoundError as e:
            hint = (
                f" Install it with: pip install 'localstate[{entry.extra}]'"
                if entry.extra
                else f" Is the module that provides {entry.target!r} installed?"
            )
            raise self._error(
                f"{where}{self.kind} {name!r} needs the missing module {e.name!r} ({entry.origin}).{hint}"
            ) from e
        except ConfigError:
            raise
        except Exception as e:  # a broken plug-in: name it precisely
            raise EngineError(
                f"{where}{self.kind} {name!r} from {entry.origin} ({entry.target}) failed to import: "
                f"{type(e).__name__}: {e}. Fix or uninstall that plug-in."
            ) from e

    def _scan_entry_points(self) -> None:
        if self._entry_points_scanned:
            return
        self._entry_points_scanned = True
        for ep in entry_points(group=self.group):
            dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
            origin = f"entry point {ep.name!r} of distribution {dist!r}"
            if ep.name in self._entries:
                old = self._entries[ep.name]
                if old.target != ep.value:
                    self._conflicts[ep.name] = self._conflict_message(ep.name, old.origin, origin)
                continue
            self._entries[ep.name] = _Entry(ep.value, None, origin)

    def reset_for_tests(self) -> None:
        """Forget loaded objects and rescan entry points (for tests that install plug-ins)."""
        with self._lock:
            self._loaded.clear()
            self._entries = {k: v for k, v in self._entries.items() if not v.origin.startswith("entry point")}
            self._conflicts.clear()
            self._entry_points_scanned = False


def _describe(target: Any) -> str:
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"


ENGINES = Registry("storage engine", "localstate.engines", UnknownEngineError)
SYSTEMS = Registry("changelog system", "localstate.systems", UnknownSystemError)

_BUILTIN_ENGINES = {
    "memory": ("localstate.engines.memory:MemoryEngineFactory", None),
    "rocksdb": ("localstate.engines.rocksdb:RocksDBEngineFactory", "rocksdb"),
    "leveldb": ("localstate.engines.leveldb:LevelDBEngineFactory", "leveldb"),
    "topn": ("localstate.engines.topn:TopNEngineFactory", None),
    "hyperloglog": ("localstate.engines.hyperloglog:HyperLogLogEngineFactory", "sketches"),
    "bloom": ("localstate.engines.bloom:BloomEngineFactory", "sketches"),
    "search": ("localstate.engines.search:SearchEngineFactory", "search"),
}
for _name, (_target, _extra) in _BUILTIN_ENGINES.items():
    ENGINES.register(_name, _target, extra=_extra, origin="built-in")

SYSTEMS.register("file", "localstate.changelog.file:FileChangelogSystem", origin="built-in")
SYSTEMS.register(
    "kafka", "localstate.changelog.kafka:KafkaChangelogSystem", extra="kafka", origin="built-in"
)
SYSTEMS.register(
    "objectstore", "localstate.changelog.objectstore:ObjectStoreChangelogSystem", extra="objectstore",
    origin="built-in",
)


def register_engine(name: str, factory: Any, clobber: bool = False) -> None:
    """Register a :class:`StorageEngineFactory` (class, instance or ``"module:attr"``)."""
    ENGINES.register(name, factory, clobber=clobber, origin="register_engine()")


def register_system(name: str, system: Any, clobber: bool = False) -> None:
    """Register a changelog system class (or ``"module:attr"``) under ``name``."""
    SYSTEMS.register(name, system, clobber=clobber, origin="register_system()")


def resolve_factory(name: str, *, store: str | None = None) -> Any:
    """The factory *instance* for engine ``name``, checked to be a StorageEngineFactory."""
    from .engine import StorageEngineFactory

    obj = ENGINES.get(name, store=store)
    if isinstance(obj, type):
        if not issubclass(obj, StorageEngineFactory):
            raise EngineError(
                f"engine {name!r} resolves to {_describe(obj)}, which is not a StorageEngineFactory "
                "subclass; subclass localstate.StorageEngineFactory and implement create()"
            )
        obj = obj()
    elif not isinstance(obj, StorageEngineFactory):
        raise EngineError(
            f"engine {name!r} resolves to {obj!r}, which is not a StorageEngineFactory; "
            "register a localstate.StorageEngineFactory subclass or instance"
        )
    return obj


def available() -> dict[str, dict[str, Any]]:
    """Every registered engine: ``{name: {"installed": bool, "origin": str, "hint": str}}``."""
    out = {}
    for name, entry in ENGINES.view().items():
        ok, why = ENGINES.installed(name)
        out[name] = {"installed": ok, "origin": entry.origin, "hint": why, "extra": entry.extra}
    return out

