"""Job configuration with Samza's key names, from a dict, a .properties file or TOML.

::

    job.name = pageviews
    job.state.dir = ./state
    stores.counts.factory = rocksdb
    stores.counts.changelog = file.pageviews-counts     # <system>.<stream>, or "none"
    stores.counts.key.serde = string
    stores.counts.msg.serde = json
    stores.counts.object.cache.size = 1000
    stores.counts.write.batch.size = 500
    stores.counts.rocksdb.block.cache.size.bytes = 16777216
    systems.file.path = ./changelog

Everything is validated when loaded: errors name the key and the fix.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .engine import StoreSpec
from .errors import ConfigError
from .options import coerce, parse_options
from .registry import SYSTEMS, did_you_mean, resolve_factory
from .serdes import get_serde

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Config"]

JOB_KEYS: dict[str, tuple[type, Any]] = {
    "job.name": (str, None),
    "job.state.dir": (str, "./state"),
    "job.partitions": (int, 1),
    "job.changelog.system": (str, "file"),
    "job.checkpoint.system": (str, None),
    "job.standby.replicas": (int, 0),
}
MAX_STANDBY_REPLICAS = 1
"""Standby copies per task the Spark runner keeps (``job.standby.replicas``)."""
STORE_KEYS: dict[str, tuple[type, Any]] = {
    "factory": (str, None),
    "changelog": (str, None),
    "key.serde": (str, "bytes"),
    "msg.serde": (str, "bytes"),
    "object.cache.size": (int, 1000),
    "write.batch.size": (int, 500),
    "rescale.key": (str, "key"),  # how `localstate rescale` finds the input key in a store key
}
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]*$")
_VALIDATED_PREFIXES = ("job.", "stores.", "systems.")


class Config:
    """A validated, immutable job configuration (picklable, so it travels to executors)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values: dict[str, Any] = {str(k).strip(): v for k, v in values.items()}
        self.stores: dict[str, StoreSpec] = {}
        self.systems: dict[str, dict[str, Any]] = {}
        self._validate()

    # -- loading ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Config:
        """From flat dotted keys (nested dicts are flattened)."""
        return cls(_flatten(values))

    @classmethod
    def from_properties(cls, path: str | Path) -> Config:
        """From a ``.properties`` file, read with Java's semantics (``java.util.Properties``,
        via the ``javaproperties`` library): ``key = value``, ``key: value`` or ``key value``;
        ``#``/``!`` start a comment only at the start of a line (``a = x # y`` is the
        value ``x # y``); ``\\`` escapes (``\\n``, ``\\uXXXX``, ``\\=``, ``\\ ``) in keys
        and values; a line ending in an odd number of backslashes continues on the next
        (its leading whitespace dropped); a later duplicate key wins. The file is UTF-8
        (Java 9+ reads ``.properties`` resource bundles as UTF-8 too)."""
        import javaproperties

        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read config file {p}: {e.strerror}") from e
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {p} is not UTF-8 text ({e})") from e
        values: dict[str, str] = {}
        lineno = 1
        try:
            for element in javaproperties.parse(text):
                key = getattr(element, "key", None)
                if key is not None:
                    if not key.strip():
                        raise ConfigError(f"{p}:{lineno}: expected 'key = value', got {element.source.rstrip()!r}")
                    values[key] = element.value
                lineno += element.source.count("\n")
        except ValueError as e:  # a malformed \\uXXXX escape
            raise ConfigError(f"{p}:{lineno}: {e}") from e
        try:
            return cls(values)
        except ConfigError as e:
            raise type(e)(f"{p}: {e}") from e

    @classmethod
    def from_toml(cls, path: str | Path) -> Config:
        """From TOML; tables and dotted keys flatten to the same dotted names."""
        p = Path(path)
        try:
            with p.open("rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"cannot read config file {p}: {e.strerror}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p} is not valid TOML: {e}") from e
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {p} is not UTF-8 text ({e})") from e
        return cls(_flatten(data))

    @classmethod
    def load(cls, path: str | Path) -> Config:
        """From ``.toml`` or ``.properties`` by file extension."""
        p = Path(path)
        if p.suffix == ".toml":
            return cls.from_toml(p)
        if p.suffix in (".properties", ".conf", ".cfg"):
            return cls.from_properties(p)
        raise ConfigError(f"config file {p} must end in .toml or .properties")

    # -- access -------------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def with_overrides(self, values: Mapping[str, Any]) -> Config:
        """A new validated config with some keys replaced."""
        merged = dict(self._values)
        merged.update(_flatten(values))
        return Config(merged)

    @property
    def job_name(self) -> str:
        return self._job["job.name"]

    @property
    def state_dir(self) -> Path:
        return Path(self._job["job.state.dir"])

    @property
    def partitions(self) -> int:
        return self._job["job.partitions"]

    @property
    def standby_replicas(self) -> int:
        """``job.standby.replicas``: warm copies of each task the Spark runner keeps on other
        executors (docs/spark.md, "Standby replicas")."""
        return self._job["job.standby.replicas"]

    @property
    def checkpoint_system(self) -> str:
        return self._job["job.checkpoint.system"]

    def __repr__(self) -> str:
        return f"Config(job={self.job_name!r}, stores={sorted(self.stores)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Config, (self._values,))

    # -- validation -----------------------------------------------------------------------
    def _validate(self) -> None:
        """Check everything; every problem found is reported in one :class:`ConfigError`
        (one line each), not only the first."""
        problems: list[ConfigError] = []

        @contextmanager
        def collect() -> Iterator[None]:
            try:
                yield
            except ConfigError as e:
                problems.append(e)

        self._validate_into(collect)
        if len(problems) == 1:
            raise problems[0]
        if problems:
            raise ConfigError(
                f"{len(problems)} problems in the config:\n" + "\n".join(f"  - {e}" for e in problems)
            )

    def _validate_into(self, collect: Callable[[], Any]) -> None:
        v = self._values
        self._job: dict[str, Any] = {}
        for key in v:
            with collect():
                if key.startswith("job.") and key not in JOB_KEYS:
                    raise ConfigError(f"unknown config key {key!r}.{did_you_mean(key, JOB_KEYS)}")
                if not key.startswith(_VALIDATED_PREFIXES) and "." not in key:
                    raise ConfigError(
                        f"config key {key!r} has no section; expected job.*, stores.<name>.* or systems.<name>.*"
                    )
        for key, (tp, default) in JOB_KEYS.items():
            self._job[key] = default
            with collect():
                self._job[key] = coerce(v[key], tp, key) if key in v else default
        with collect():
            if not self._job["job.name"]:
                raise ConfigError("missing required config key 'job.name' (e.g. job.name = pageviews)")
            if not _NAME.match(self._job["job.name"]):
                raise ConfigError(
                    f"job.name = {self._job['job.name']!r}: use letters, digits, '_' and '-' only"
                )
        with collect():
            if self._job["job.partitions"] < 1:
                raise ConfigError(f"job.partitions = {self._job['job.partitions']}: must be >= 1")
        with collect():
            replicas = v.get("job.standby.replicas", 0)
            whole_float = isinstance(replicas, float) and replicas.is_integer()  # coerce would take 1.0
            if whole_float or not 0 <= self._job["job.standby.replicas"] <= MAX_STANDBY_REPLICAS:
                self._job["job.standby.replicas"] = 0
                raise ConfigError(
                    f"job.standby.replicas = {replicas!r}: must be a whole number from 0 (no standby copies) to "
                    f"{MAX_STANDBY_REPLICAS} (one warm copy of each task on another executor)")

        store_keys: dict[str, dict[str, Any]] = {}
        system_keys: dict[str, dict[str, Any]] = {}
        for key, value in v.items():
            for section, into in (("stores.", store_keys), ("systems.", system_keys)):
                if key.startswith(section):
                    name, _, rest = key[len(section):].partition(".")
                    with collect():
                        if not name or not rest:
                            raise ConfigError(f"config key {key!r} should be {section}<name>.<option>")
                        into.setdefault(name, {})[rest] = value

        default_system = self._job["job.changelog.system"]
        for name, keys in store_keys.items():
            with collect():
                self.stores[name] = self._store_spec(name, keys, default_system)

        used_systems = {s.changelog[0] for s in self.stores.values() if s.changelog}
        if self._job["job.checkpoint.system"] is None:
            firsts = [s.changelog[0] for s in self.stores.values() if s.changelog]
            self._job["job.checkpoint.system"] = firsts[0] if firsts else default_system
        used_systems.add(self._job["job.checkpoint.system"])
        for name in sorted(set(system_keys) | used_systems):
            with collect():
                self.systems[name] = self._system_options(name, system_keys.get(name, {}))

    def _store_spec(self, name: str, keys: dict[str, Any], default_system: str) -> StoreSpec:
        pre = f"stores.{name}"
        if not _NAME.match(name):
            raise ConfigError(f"store name {name!r} ({pre}.*): use letters, digits, '_' and '-' only")
        if "factory" not in keys:
            raise ConfigError(
                f"store {name!r} has no engine: set {pre}.factory (e.g. memory, rocksdb, leveldb)"
            )
        try:
            factory = resolve_factory(str(keys["factory"]), store=name)
        except ConfigError as e:
            raise type(e)(f"{pre}.factory: {e}") from e
        opt_prefix = factory.options_prefix
        base: dict[str, Any] = {}
        engine_raw: dict[str, Any] = {}
        ttl_raw: dict[str, Any] = {}
        errors: list[str] = []
        for key, value in keys.items():
            if key in STORE_KEYS:
                base[key] = value
            elif key.startswith("ttl."):
                ttl_raw[key[4:]] = value
            elif opt_prefix and key.startswith(opt_prefix + "."):
                engine_raw[key[len(opt_prefix) + 1:]] = value
            else:
                valid = list(STORE_KEYS) + ["ttl.ms"] + ([f"{opt_prefix}.<option>"] if opt_prefix else [])
                hint = did_you_mean(key, list(STORE_KEYS) + ["ttl.ms"] + _engine_keys(factory))
                errors.append(
                    f"unknown config key '{pre}.{key}' for store {name!r}.{hint}"
                    + ("" if "Did you mean" in hint else f" Valid keys: {', '.join(valid)}.")
                )
        vals: dict[str, Any] = {}
        for k, (tp, d) in STORE_KEYS.items():
            try:
                vals[k] = coerce(base[k], tp, f"{pre}.{k}") if k in base else d
            except ConfigError as e:
                errors.append(str(e))
        if errors:
            raise ConfigError("\n  - ".join(errors))
        options = None
        if factory.options_type is not None:
            options = parse_options(factory.options_type, engine_raw, f"{pre}.{opt_prefix}")
        for which in ("key.serde", "msg.serde"):
            try:
                get_serde(vals[which], store=name)
            except ConfigError as e:
                raise type(e)(f"{pre}.{which}: {e}") from e
        cache, batch = vals["object.cache.size"], vals["write.batch.size"]
        if batch < 1:
            raise ConfigError(f"{pre}.write.batch.size = {batch}: must be >= 1")
        if cache < 0:
            raise ConfigError(f"{pre}.object.cache.size = {cache}: must be >= 0 (0 disables the cache)")
        if 0 < cache < batch:
            raise ConfigError(
                f"store {name!r}: {pre}.object.cache.size ({cache}) is smaller than "
                f"{pre}.write.batch.size ({batch}); dirty entries must fit in the cache. "
                f"Raise the cache size to at least {batch} or lower the batch size."
            )
        changelog = _parse_changelog(vals["changelog"], name, self._job["job.name"], default_system)
        ttl = _parse_ttl(name, ttl_raw, factory, str(keys["factory"]))
        return StoreSpec(
            name=name,
            factory=str(keys["factory"]),
            options=options,
            key_serde=vals["key.serde"],
            msg_serde=vals["msg.serde"],
            changelog=changelog,
            object_cache_size=cache,
            write_batch_size=batch,
            ttl=ttl,
            raw=dict(keys),
        )

    def _system_options(self, name: str, keys: dict[str, Any]) -> dict[str, Any]:
        pre = f"systems.{name}"
        sys_type = str(keys.get("type", name))
        try:
            cls = SYSTEMS.get(sys_type)
        except ConfigError as e:
            raise type(e)(f"{pre}: {e} (set {pre}.type to a registered changelog system)") from e
        from localstate.changelog.base import ChangelogSystem

        if not (isinstance(cls, type) and issubclass(cls, ChangelogSystem)):
            raise ConfigError(f"{pre}: changelog system {sys_type!r} is {cls!r}, not a ChangelogSystem subclass")
        if cls.options_type is not None:
            cls.parse_settings(name, keys)
            return dict(keys)
        for key in keys:
            if key != "type":
                raise ConfigError(
                    f"unknown config key '{pre}.{key}': changelog system {sys_type!r} takes no options "
                    "(a system declares its options as a dataclass, options_type)"
                )
        return dict(keys)


def _parse_ttl(store: str, raw: dict[str, Any], factory: Any, engine: str) -> Any:
    """``stores.<s>.ttl.*`` → a TtlPolicy; refused for engines that are not key-value stores."""
    from .layers.ttl import TtlPolicy

    policy = TtlPolicy.parse(store, raw)
    if policy is not None and engine_kind(factory) == "other":
        raise ConfigError(
            f"stores.{store}.ttl.ms: engine {engine!r} is not a key-value store and has no TTL. "
            "TTL expires whole entries; a sketch (hyperloglog, bloom) cannot forget one item it has "
            "merged, and top-N and search keep their own data model (expire their entries with a "
            "timer and remove()/delete). Remove the ttl.* keys, or use a key-value engine "
            "(memory, rocksdb, leveldb)."
        )
    return policy


def engine_kind(factory: Any) -> str:
    """``"kv"``, ``"other"`` or ``"unknown"``: what ``factory.create`` is declared to return."""
    import typing

    from .kv import KeyValueStore

    try:
        ret = typing.get_type_hints(type(factory).create).get("return")
    except Exception:
        return "unknown"
    if not isinstance(ret, type):
        return "unknown"
    return "kv" if issubclass(ret, KeyValueStore) else "other"


def _engine_keys(factory: Any) -> list[str]:
    if factory.options_type is None or not factory.options_prefix:
        return []
    from .options import option_keys

    return [f"{factory.options_prefix}.{k}" for k in option_keys(factory.options_type)]


def _parse_changelog(value: Any, store: str, job: str, default_system: str) -> tuple[str, str] | None:
    if value is None:
        return (default_system, f"{job}-{store}")
    s = str(value).strip()
    if s.lower() in ("none", "off", "false", ""):
        return None
    system, dot, stream = s.partition(".")
    if not dot or not system or not stream:
        raise ConfigError(
            f"stores.{store}.changelog = {s!r}: expected '<system>.<stream>' "
            f"(e.g. file.{job}-{store} or kafka.{job}-{store}) or 'none'"
        )
    if not _NAME.match(stream.replace(".", "_")):
        raise ConfigError(f"stores.{store}.changelog = {s!r}: stream names use letters, digits, '.', '_', '-'")
    return (system, stream)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out

