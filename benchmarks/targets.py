"""What the generic benchmark workloads run against.

A :class:`Target` is what a workload is measured on:

* ``store`` — the store a task sees: ``TaskStorage(config).store(...)`` with the
  object cache, the bytes serdes and the changelog (``--changelog``), commits included;
* ``engine`` — the raw engine under it (``TaskStorage.engine``), no layers, no log;
* ``baseline`` — the raw library without localstate: a plain ``dict``, ``rocksdict``,
  ``plyvel``.

Every target is driven through one small :class:`Handle` API (bytes keys and values),
so a workload is written once.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localstate.config import Config
from localstate.errors import ConfigError
from localstate.kv import KeyValueStore
from localstate.registry import ENGINES, did_you_mean, resolve_factory
from localstate.storage import TaskStorage

from .runner import (
    BenchParams,
)

__all__ = ["Target", "Handle", "KVHandle", "targets_for", "make_config", "BASELINES", "NotApplicable", "STORE"]

STORE = "bench"


# -- handles --------------------------------------------------------------------------------
class Handle:
    """A bytes key-value target opened for one trial.

    Subclasses bind the library's own methods as ``put``/``get``/... attributes where
    they fit, so a workload's hot loop calls the library directly.
    """

    path: Path

    def put(self, key: bytes, value: bytes) -> None:
        raise NotImplementedError

    def put_all(self, pairs: list[tuple[bytes, bytes]]) -> None:
        raise NotImplementedError

    def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def get_all(self, keys: list[bytes]) -> Any:
        raise NotImplementedError

    def delete(self, key: bytes) -> None:
        raise NotImplementedError

    def scan(self, start: bytes | None, stop: bytes | None, limit: int | None = None) -> int:
        """Read records of ``[start, stop)`` in key order (at most ``limit``); return how many."""
        raise NotImplementedError

    def commit(self) -> None:
        """Make writes visible and durable as the target does at a commit point."""

    def close(self) -> None:
        raise NotImplementedError


def _count(it: Iterator[Any], limit: int | None) -> int:
    n = 0
    if limit is None:
        for _ in it:
            n += 1
    else:
        for _ in itertools.islice(it, limit):
            n += 1
    return n


class KVHandle(Handle):
    """A localstate :class:`KeyValueStore` (the layered store or the raw engine)."""

    def __init__(self, storage: TaskStorage, kv: KeyValueStore[bytes, bytes], path: Path, commit: bool) -> None:
        self.storage, self.kv, self.path, self._commit = storage, kv, path, commit
        self.put = kv.put  # type: ignore[method-assign]
        self.get = kv.get  # type: ignore[method-assign]
        self.delete = kv.delete  # type: ignore[method-assign]
        self.put_all = kv.put_all  # type: ignore[method-assign]
        self.get_all = kv.get_all  # type: ignore[method-assign]

    def scan(self, start: bytes | None, stop: bytes | None, limit: int | None = None) -> int:
        with self.kv.range(start, stop) as it:
            return _count(it, limit)

    def commit(self) -> None:
        if self._commit:
            self.storage.commit()
        else:
            self.kv.flush()

    def close(self) -> None:
        self.storage.close()


class DictHandle(Handle):
    """A plain ``dict`` (no order: range scans are not applicable)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        d: dict[bytes, bytes] = {}
        self.d = d
        self.put = d.__setitem__  # type: ignore[method-assign]
        self.get = d.get  # type: ignore[method-assign]
        self.put_all = d.update  # type: ignore[method-assign]

    def get_all(self, keys: list[bytes]) -> Any:
        get = self.d.get
        return [get(k) for k in keys]

    def delete(self, key: bytes) -> None:
        self.d.pop(key, None)

    def scan(self, start: bytes | None, stop: bytes | None, limit: int | None = None) -> int:
        if start is not None or stop is not None:
            raise NotApplicable("a plain dict has no key order, so no range scans")
        return _count(iter(self.d.items()), limit)

    def close(self) -> None:
        self.d = {}


class RocksdictHandle(Handle):
    """Raw ``rocksdict`` in raw (bytes) mode; batches via ``WriteBatch``."""

    def __init__(self, path: Path) -> None:
        from rocksdict import Options, Rdict, WriteBatch

        self.path = path
        self._wb = WriteBatch
        self.db = Rdict(str(path), Options(raw_mode=True))
        self.put = self.db.put  # type: ignore[method-assign]
        self.get = self.db.get  # type: ignore[method-assign]
        self.delete = self.db.delete  # type: ignore[method-assign]

    def put_all(self, pairs: list[tuple[bytes, bytes]]) -> None:
        wb = self._wb(raw_mode=True)
        put = wb.put
        for k, v in pairs:
            put(k, v)
        self.db.write(wb)

    def get_all(self, keys: list[bytes]) -> Any:
        return self.db.get(keys)

    def scan(self, start: bytes | None, stop: bytes | None, limit: int | None = None) -> int:
        from rocksdict import ReadOptions

        opts = ReadOptions()
        if stop is not None:
            opts.set_iterate_upper_bound(stop)
        return _count(iter(self.db.items(from_key=start, read_opt=opts)), limit)

    def close(self) -> None:
        self.db.close()


class PlyvelHandle(Handle):
    """Raw ``plyvel`` (LevelDB); batches via ``write_batch``."""

    def __init__(self, path: Path) -> None:
        import plyvel

        self.path = path
        self.db = plyvel.DB(str(path), create_if_missing=True)
        self.put = self.db.put  # type: ignore[method-assign]
        self.get = self.db.get  # type: ignore[method-assign]
        self.delete = self.db.delete  # type: ignore[method-assign]

    def put_all(self, pairs: list[tuple[bytes, bytes]]) -> None:
        with self.db.write_batch() as wb:
            put = wb.put
            for k, v in pairs:
                put(k, v)

    def get_all(self, keys: list[bytes]) -> Any:
        get = self.db.get
        return [get(k) for k in keys]

    def scan(self, start: bytes | None, stop: bytes | None, limit: int | None = None) -> int:
        with self.db.iterator(start=start, stop=stop) as it:
            return _count(it, limit)

    def close(self) -> None:
        self.db.close()


class NotApplicable(Exception):
    """The workload does not apply to this target; the cell is left out, not an error."""


# -- targets --------------------------------------------------------------------------------
BASELINES: dict[str, tuple[Callable[[Path], Handle], str | None]] = {
    "dict": (DictHandle, None),
    "rocksdict": (RocksdictHandle, "rocksdict"),
    "plyvel": (PlyvelHandle, "plyvel"),
}
"""Raw-library baselines: ``name → (handle class, module that must be importable)``."""

_ENGINE_BASELINE = {"memory": "dict", "rocksdb": "rocksdict", "leveldb": "plyvel"}


@dataclass(frozen=True)
class Target:
    """What a workload runs on; ``baseline`` names the raw-library target it is compared with."""

    name: str
    kind: str  # "store" | "engine" | "baseline" | "changelog"
    engine: str
    baseline: str | None = None

    def open(self, params: BenchParams, root: Path, *, changelog: bool = True) -> Handle:
        """A fresh handle whose files live under ``root`` (which the caller removes)."""
        root.mkdir(parents=True, exist_ok=True)
        if self.kind == "baseline":
            return BASELINES[self.engine][0](root / "db")
        store = self.kind in ("store", "changelog")
        storage = TaskStorage(make_config(self, params, root, changelog=store and changelog), 0)
        try:
            kv = storage.store(STORE) if store else storage.engine(STORE)
            if not isinstance(kv, KeyValueStore):
                raise NotApplicable(f"engine {self.engine!r} is not a key-value engine")
            return KVHandle(storage, kv, root, commit=store)
        except BaseException:
            storage.close()
            raise


def make_config(target: Target, params: BenchParams, root: Path, *, changelog: bool = True) -> Config:
    """One store ``bench`` on ``target.engine`` under ``root``, with the run's knobs."""
    store = target.kind in ("store", "changelog")
    values: dict[str, Any] = {
        "job.name": "bench",
        "job.state.dir": str(root / "state"),
        "systems.file.path": str(root / "changelog"),
        f"stores.{STORE}.factory": target.engine,
        f"stores.{STORE}.object.cache.size": params.cache_size if store else 0,
        f"stores.{STORE}.write.batch.size": params.batch_size,
    }
    if not changelog or params.changelog == "none":
        values[f"stores.{STORE}.changelog"] = "none"
    elif params.changelog == "kafka":
        if not params.kafka_bootstrap:
            raise ConfigError("--changelog kafka needs a broker: pass --kafka-bootstrap HOST:PORT")
        values["job.changelog.system"] = "kafka"
        values["job.checkpoint.system"] = "file"
        values["systems.kafka.bootstrap.servers"] = params.kafka_bootstrap
        # one topic per trial directory: the restore reopens the same one
        values[f"stores.{STORE}.changelog"] = f"kafka.bench-{os.getpid()}-{root.name}"
    for k, v in params.options:
        values[f"stores.{STORE}.{k}"] = v
    return Config.from_dict(values)


def targets_for(engines: list[str], baselines: bool = True, direct: bool = True) -> list[Target]:
    """Targets for ``engines`` (registered names, entry points or ``module:Factory``):
    the store, the raw engine and the matching raw-library baseline of each.

    Unknown names raise :class:`ConfigError` listing the registered engines; an engine
    whose extra is missing raises with the install hint.
    """
    out: list[Target] = []
    wanted: list[str] = []
    for name in engines:
        if ":" not in name and name not in ENGINES.names():
            hint = did_you_mean(name, ENGINES.names())
            raise ConfigError(
                f"unknown engine {name!r}.{hint if hint.startswith(' Did you mean') else ''} "
                f"Registered engines: {', '.join(ENGINES.names())}; or pass 'package.module:Factory'."
            )
        resolve_factory(name)  # import errors and non-factories are reported up front
        base = _ENGINE_BASELINE.get(name, "dict")
        out.append(Target(name, "store", name, base))
        if direct:
            out.append(Target(f"{name}/direct", "engine", name, base))
        if base not in wanted:
            wanted.append(base)
    if baselines:
        for b in wanted:
            module = BASELINES[b][1]
            if module is not None:
                try:
                    __import__(module)
                except ImportError:
                    continue
            out.append(Target(b, "baseline", b))
    return out


