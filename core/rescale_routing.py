"""Where each change record of a rescaled store goes: the record layouts of the engines
(:class:`RecordLayout`, :func:`layout_for`), the routing value of a store key
(:func:`route_of`, ``stores.<s>.rescale.key``) and the split of old tasks' states into
new tasks' (:func:`route_store`), by :func:`localstate.partitioning.spark_hash` — the
function the Spark runner routes input rows with. Used by :mod:`localstate.rescale`
on the driver and, for ``rescale --spark``, on executors."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .engine import StoreSpec
from .errors import ConfigError, CorruptionError, InvalidValueError, LocalStateError
from .partitioning import spark_hash, spark_hashes
from .registry import resolve_factory
from .serdes import get_serde

__all__ = ["RecordLayout", "layout_for", "merge_records", "route_of", "route_store"]

_META_KEY = b"\x00"


@dataclass(frozen=True)
class RecordLayout:
    """How a store's change records relate to its keys, for rescaling.

    ``kind = "key"``: a record key is the store's encoded key followed by
    ``key_suffix`` bytes (a register or word index); records go to the task of their
    key. ``kind = "task"``: the records describe the whole task (one filter per task);
    they can only be merged — old task ``p`` goes to new task ``p % N``, which is where
    its keys go exactly when ``N`` divides the old count — and ``merge`` combines the
    values two old tasks hold for one record key. ``shared_keys`` are records every
    task holds alike (an engine's meta record); each new task gets them.
    """

    kind: Literal["key", "task"] = "key"
    key_suffix: int = 0
    shared_keys: frozenset[bytes] = frozenset()
    merge: Callable[[bytes, bytes], bytes] | None = None


def _or_words(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "big") | int.from_bytes(b, "big")).to_bytes(len(a), "big")


_KEYED = RecordLayout()
_NOT_SPLITTABLE = {
    "topn": "a topn store keeps one heap of the best N members per task; members an old task evicted are "
            "gone, so neither splitting nor merging the heaps gives the heap a task of the new job would "
            "hold. Rebuild it from its source, or start it over with `localstate restore --reset STORE` "
            "after the rescale (drop it from the config for the rescale)",
}


def layout_for(spec: StoreSpec) -> RecordLayout:
    """The :class:`RecordLayout` of ``spec``'s engine; raises :class:`ConfigError`
    naming the store when its state cannot be re-partitioned.

    Built in: ``memory``, ``rocksdb``, ``leveldb``, ``search`` (record key = key),
    ``hyperloglog`` and keyed ``bloom`` (key + register/word index; meta record
    shared), a single ``bloom`` filter per task (merged by OR on scale-down to a
    divisor of the count); ``topn`` is refused. A plug-in declares its layout as the
    factory attribute ``rescale_layout``.
    """
    name = spec.factory
    if name in ("memory", "rocksdb", "leveldb", "search"):
        return _KEYED
    if name == "hyperloglog":
        return RecordLayout(key_suffix=2, shared_keys=frozenset({_META_KEY}))
    if name == "bloom":
        if getattr(spec.options, "keyed", False):
            return RecordLayout(key_suffix=4, shared_keys=frozenset({_META_KEY}))
        return RecordLayout(kind="task", shared_keys=frozenset({_META_KEY}), merge=_or_words)
    if name in _NOT_SPLITTABLE:
        raise ConfigError(f"store {spec.name!r} ({name}) cannot be rescaled: {_NOT_SPLITTABLE[name]}")
    layout = resolve_factory(name, store=spec.name).rescale_layout
    if isinstance(layout, RecordLayout):
        return layout
    raise ConfigError(
        f"store {spec.name!r}: engine {name!r} does not say how its change records split by key "
        "(a factory attribute rescale_layout = localstate.rescale.RecordLayout(...)), so it cannot be rescaled"
    )


_ROUTE = re.compile(r"^(?:key(?:\[(\d+)\])?|(timer))(\s+as\s+int32)?$")


def route_of(spec: StoreSpec) -> Callable[[bytes], Any]:
    """``stores.<s>.rescale.key``: how to get the routing value (the input key column's
    value) from a store key's bytes. ``key`` (default): the decoded key itself;
    ``key[i]``: element ``i`` of a tuple key (``tuple`` serde); ``timer``: the key a
    timer of a timers store (:mod:`localstate.timers`) was registered for; ``... as
    int32``: the input key column is int32, not int64 (Spark hashes them differently)."""
    text = str(spec.raw.get("rescale.key", "key")).strip()
    m = _ROUTE.match(text)
    if not m:
        raise ConfigError(
            f"stores.{spec.name}.rescale.key = {text!r}: expected 'key', 'key[i]' (element i of a tuple key) or "
            "'timer' (a timers store), optionally followed by ' as int32'"
        )
    int32 = m.group(3) is not None
    if m.group(2) is not None:
        if spec.key_serde != "bytes":
            raise ConfigError(f"stores.{spec.name}.rescale.key = {text!r} is for a timers store (key.serde = bytes), "
                              f"not key.serde = {spec.key_serde!r}")
        from .timers import timer_key

        def timer_route(key: bytes) -> Any:
            return timer_key(key)

        timer_route.as_int32 = int32  # type: ignore[attr-defined]
        return timer_route
    decode = get_serde(spec.key_serde, store=spec.name).decode
    index = None if m.group(1) is None else int(m.group(1))
    if index is not None and spec.key_serde != "tuple":
        raise ConfigError(f"stores.{spec.name}.rescale.key = {text!r} needs key.serde = tuple, not {spec.key_serde!r}")

    def route(key: bytes) -> Any:
        value = decode(key)
        if index is not None:
            if not isinstance(value, tuple) or index >= len(value):
                raise InvalidValueError(f"store {spec.name!r}: key {value!r} has no element {index}")
            value = value[index]
        return value

    route.as_int32 = int32  # type: ignore[attr-defined]
    return route



def route_store(
    spec: StoreSpec, old: int, new: int, states: Mapping[int, dict[bytes, bytes]]
) -> list[dict[bytes, bytes]]:
    """The ``new`` tasks' records of one store from the states of old tasks (of ``old``),
    ``{old task: {record key: value}}`` (the shared records are taken out of them).
    Raises :class:`ConfigError` / :class:`CorruptionError` naming the store and key when
    a record cannot go with its rows."""
    layout = layout_for(spec)
    out: list[dict[bytes, bytes]] = [{} for _ in range(new)]
    shared: dict[bytes, bytes] = {}
    for p, state in states.items():
        for key in layout.shared_keys & state.keys():
            value = state.pop(key)
            if shared.setdefault(key, value) != value:
                raise CorruptionError(
                    f"store {spec.name!r}: old tasks hold different {key!r} records ({shared[key]!r} vs {value!r} in "
                    f"partition {p}); they were written with different engine settings. Nothing was changed."
                )
    if layout.kind == "task":
        if old % new:
            raise ConfigError(
                f"store {spec.name!r} ({spec.factory}) holds one structure per task: it can only be merged, old "
                f"task p into new task p % N, which keeps each key with its rows only when N divides the old count "
                f"({old}); {new} does not. Rescale to a divisor of {old}. Nothing was changed."
            )
        merge = layout.merge
        for p, state in states.items():
            target = out[p % new]
            for k, v in state.items():
                before = target.get(k)
                target[k] = v if before is None or merge is None else merge(before, v)
    else:
        route = route_of(spec)
        int32 = getattr(route, "as_int32", False)
        suffix = layout.key_suffix
        checkable = old > 1 or "rescale.key" in spec.raw
        if not checkable:
            raise ConfigError(
                f"store {spec.name!r}: with one old task nothing shows that its keys are the input's keys (a "
                f"task-level store, e.g. a watermark, would be split wrongly). Say how they are: set "
                f"stores.{spec.name}.rescale.key = key (or key[i] for an element of a tuple key). Nothing was changed."
            )
        for p, state in states.items():
            keys = list(state)
            values = [_route_value(spec, route, p, k, suffix) for k in keys]
            try:
                hashes = spark_hashes(values, as_int32=int32)
            except LocalStateError:  # name the key: hash one at a time to find it
                hashes = [_hash_value(spec, p, k, value, int32) for k, value in zip(keys, values)]
            # task_for(value, n) is spark_hash(value) % n: one hash serves both counts.
            for k, value, h in zip(keys, values, hashes):
                if h % old != p:
                    raise ConfigError(
                        f"store {spec.name!r}: key {value!r} is held by old task {p} but its input rows go to task "
                        f"{h % old}: the store is not partitioned by the input key ({_fix(spec, k)}). Its state "
                        "cannot be moved with the rows. Nothing was changed."
                    )
                out[h % new][k] = state[k]
    if shared:
        for target in out:
            target.update(shared)
    return out


def _fix(spec: StoreSpec, key: bytes) -> str:
    """What to set for a store whose record ``key`` does not route to its task."""
    from .timers import is_timer_record

    if spec.key_serde == "bytes" and "rescale.key" not in spec.raw and is_timer_record(key):
        return (f"its keys are timers, which carry the input key: set stores.{spec.name}.rescale.key = timer "
                "(add ' as int32' for an int32 key column)")
    if spec.key_serde == "tuple":
        return (f"a tuple key with the input key inside: set stores.{spec.name}.rescale.key = key[i]; or a "
                "task-level store such as a watermark")
    return "a task-level store such as a watermark, or keys with the input key inside"


def _route_value(spec: StoreSpec, route: Callable[[bytes], Any], p: int, key: bytes, suffix: int) -> Any:
    """The routing value of record key ``key`` of old task ``p``, or an error naming it."""
    if suffix and len(key) < suffix:
        raise CorruptionError(
            f"store {spec.name!r} partition {p}: change record key {key!r} is shorter than the "
            f"{spec.factory} layout allows. Nothing was changed."
        )
    try:
        return route(key[:-suffix] if suffix else key)
    except LocalStateError as e:
        raise type(e)(f"store {spec.name!r} partition {p}: key {key!r}: {e}. Nothing was changed.") from e
    except Exception as e:
        raise InvalidValueError(
            f"store {spec.name!r} partition {p}: key {key!r} does not decode with key.serde = "
            f"{spec.key_serde!r} ({e}). Nothing was changed."
        ) from e


def _hash_value(spec: StoreSpec, p: int, key: bytes, value: Any, int32: bool) -> int:
    try:
        return spark_hash(value, as_int32=int32)
    except LocalStateError as e:
        raise type(e)(f"store {spec.name!r} partition {p}: key {key!r}: {e}. Nothing was changed.") from e



def merge_records(spec: StoreSpec, parts: Iterable[Mapping[bytes, bytes]]) -> dict[bytes, bytes]:
    """One new task's records of ``spec`` from the pieces several old tasks sent it."""
    merge = layout_for(spec).merge
    out: dict[bytes, bytes] = {}
    for part in parts:
        for k, v in part.items():
            before = out.get(k)
            out[k] = v if before is None or merge is None else merge(before, v)
    return out


