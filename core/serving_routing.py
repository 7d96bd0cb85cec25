"""Which stores a state server serves and which task holds a key: the job's own routing
rule (``stores.<s>.rescale.key`` hashed as Spark's ``repartition(N, key)``), and the
checks of the tasks, routes and directory a server is given."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .config import Config
from .engine import StoreSpec
from .errors import ConfigError, InvalidValueError
from .layout import job_dir
from .partitioning import task_for
from .reader import _creates_kv
from .registry import did_you_mean, resolve_factory
from .rescale_routing import route_of
from .serdes import describe_encode_error, get_serde
from .serving_answers import UnknownStoreError
from .store_open import task_partition

__all__ = ["partition_for", "serving_specs", "not_served", "encode_key", "routed", "check_tasks", "check_routes",
           "check_directory"]


def partition_for(config: Config, store: str, key: Any) -> int:
    """The task ``config``'s job routes ``key`` of key-value store ``store`` to (the
    partition of the input rows it comes from), as :meth:`StateServer.partition_for`."""
    spec = serving_specs(config, [store])[store]
    return routed(spec, route_of(spec), encode_key(spec, key), config.partitions)


def encode_key(spec: StoreSpec, key: Any) -> bytes:
    """``key`` encoded by the store's key serde; an error naming the store when it cannot be."""
    if key is None:
        raise InvalidValueError(f"store {spec.name!r}: None is not a valid key")
    serde = get_serde(spec.key_serde, store=spec.name)
    try:
        return serde.encode(key)
    except Exception as e:
        raise describe_encode_error(spec.name, "key", serde, key, e) from e


def routed(spec: StoreSpec, route: Callable[[bytes], Any], encoded: bytes, partitions: int) -> int:
    """The task of a store key: its routing value (``stores.<s>.rescale.key``) hashed as
    Spark's ``repartition(N, key)`` hashes the input key."""
    value = route(encoded)
    try:
        return task_for(value, partitions, as_int32=getattr(route, "as_int32", False))
    except InvalidValueError as e:
        raise InvalidValueError(
            f"store {spec.name!r}: {e}. If the store's key carries the input key, say where: "
            f"stores.{spec.name}.rescale.key = key[i] (element i of a tuple key)"
        ) from e


def not_served(spec: StoreSpec) -> str:
    """Why a store of the job cannot be served."""
    if spec.changelog is None:
        return (f"store {spec.name!r} has no changelog (stores.{spec.name}.changelog): its state lives only in the "
                "running task, so it cannot be served")
    return (f"store {spec.name!r} uses engine {spec.factory!r}, not a key-value engine: it cannot be served by key "
            "(read it with localstate.StateReader)")


def serving_specs(config: Config, stores: Iterable[str] | None) -> dict[str, StoreSpec]:
    """The stores to serve: ``stores`` (each checked), or every key-value store with a changelog."""
    servable = {n: s for n, s in config.stores.items()
                if s.changelog is not None and _creates_kv(resolve_factory(s.factory, store=n))}
    if stores is None:
        return servable
    out = {}
    for name in stores:
        if name not in config.stores:
            raise UnknownStoreError(f"job {config.job_name!r} has no store named {name!r}."
                                    f"{did_you_mean(name, config.stores)}")
        if name not in servable:
            raise ConfigError(not_served(config.stores[name]))
        out[name] = servable[name]
    return out


def check_tasks(config: Config, tasks: Iterable[int] | None) -> tuple[int, ...]:
    """The task partitions a server holds: ``tasks`` checked against the job, or all."""
    if tasks is None:
        return tuple(range(config.partitions))
    out = tuple(dict.fromkeys(task_partition(p) for p in tasks))
    bad = [p for p in out if not 0 <= p < config.partitions]
    if bad:
        raise ConfigError(f"tasks {bad} are out of range: job {config.job_name!r} has job.partitions = "
                          f"{config.partitions}, so 0..{config.partitions - 1}")
    if not out:
        raise ConfigError("a state server needs at least one task")
    return out


def check_routes(config: Config, routes: Mapping[int, str], tasks: tuple[int, ...]) -> dict[int, str]:
    """``{partition: base URL}`` of the servers holding the tasks this one does not."""
    out = {}
    for p, url in routes.items():
        p = task_partition(p)
        if not 0 <= p < config.partitions:
            raise ConfigError(f"route for task {p}: job {config.job_name!r} has tasks 0..{config.partitions - 1}")
        if p in tasks:
            continue  # this server holds it: its own copy answers
        parsed = urllib.parse.urlsplit(str(url))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"route for task {p}: {url!r} is not an http:// base URL (e.g. http://127.0.0.1:8001)")
        out[p] = str(url).rstrip("/")
    return out


def check_directory(config: Config, directory: Path) -> None:
    """The server's copies never live where the job's tasks keep theirs."""
    mine = directory.resolve()
    state, job = config.state_dir.resolve(), job_dir(config).resolve()
    if mine == state or mine.is_relative_to(job) or job.is_relative_to(mine):
        raise ConfigError(
            f"the state server's directory {directory} is (or holds, or lies in) the job's state "
            f"{job}: the server keeps copies of its own and never touches the writer's; give another directory"
        )
