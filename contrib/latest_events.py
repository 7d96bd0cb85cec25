"""A non-key-value example engine: the latest N events per key (a ring buffer per key).

Shows how an engine with its own data model maps its state onto change records and
restores from them — the whole fault-tolerance story of a non-KV engine:

* state: for each key, N slots; event number ``seq`` goes to slot ``seq % N``;
* change record: ``key-bytes + b"\\x00" + slot`` → ``seq (8 bytes) + event bytes``.
  Overwriting a slot *is* the eviction, so the changelog (after compaction) holds at
  most N records per key and no tombstones are needed except for ``clear(key)``;
* ``restore`` puts each record back in its slot; ``current`` reads a slot back.

Config: ``stores.recent.factory = localstate.contrib.latest_events:LatestEventsFactory``,
``stores.recent.latest.size = 10`` and a ``key.serde``/``msg.serde`` for keys/events.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from localstate import (
    ChangeRecord,
    ConfigError,
    StorageEngine,
    StorageEngineFactory,
    StoreClosedError,
    StoreContext,
    StoreSpec,
)
from localstate.testing.torture_adapters import WorkloadAdapter, register_adapter

__all__ = ["LatestEvents", "LatestEventsFactory", "LatestEventsOptions", "LatestEventsWorkload"]

_SEQ = struct.Struct(">Q")
_SLOT = struct.Struct(">H")


@dataclass(frozen=True)
class LatestEventsOptions:
    """``stores.<s>.latest.size``: events kept per key (default 10, at most 65535)."""

    size: int = 10

    def validate(self, prefix: str) -> None:
        if not 1 <= self.size <= 65535:
            raise ConfigError(f"{prefix}.size = {self.size}: must be between 1 and 65535")


class LatestEvents(StorageEngine):
    """``append(key, event)``, ``latest(key)`` (newest first), ``clear(key)``."""

    def __init__(self, context: StoreContext, options: LatestEventsOptions) -> None:
        self.size = options.size
        self._log = context.change_logger
        self._key = context.key_serde
        self._event = context.msg_serde
        self._name = context.store
        self._slots: dict[bytes, dict[int, tuple[int, bytes]]] | None = {}

    def _state(self) -> dict[bytes, dict[int, tuple[int, bytes]]]:
        if self._slots is None:
            raise StoreClosedError(f"store {self._name!r} is closed")
        return self._slots

    def append(self, key: Any, event: Any) -> None:
        """Add ``event`` as the newest for ``key``; the oldest beyond N is dropped."""
        k = self._key.encode(key) if self._key else key
        data = self._event.encode(event) if self._event else event
        slots = self._state().setdefault(k, {})
        seq = max((s for s, _ in slots.values()), default=-1) + 1
        slot = seq % self.size
        slots[slot] = (seq, data)
        self._log.log(k + b"\x00" + _SLOT.pack(slot), _SEQ.pack(seq) + data)

    def latest(self, key: Any) -> list[Any]:
        """The kept events of ``key``, newest first (empty if none)."""
        k = self._key.encode(key) if self._key else key
        slots = self._state().get(k, {})
        decode = self._event.decode if self._event else bytes
        return [decode(data) for _, data in sorted(slots.values(), reverse=True)]

    def clear(self, key: Any) -> None:
        """Forget every event of ``key`` (tombstones for its slots)."""
        k = self._key.encode(key) if self._key else key
        for slot in self._state().pop(k, {}):
            self._log.log(k + b"\x00" + _SLOT.pack(slot), None)

    # -- StorageEngine ----------------------------------------------------------------
    def restore(self, records: Iterable[ChangeRecord], *, into_empty: bool = False) -> None:
        state = self._state()
        for rk, value in records:
            k, slot = rk[:-3], _SLOT.unpack(rk[-2:])[0]
            if value is None:
                slots = state.get(k)
                if slots is not None:
                    slots.pop(slot, None)
                    if not slots:
                        del state[k]
            else:
                state.setdefault(k, {})[slot] = (_SEQ.unpack(value[:8])[0], value[8:])

    def current(self, keys: Iterable[bytes]) -> list[ChangeRecord]:
        state = self._state()
        out: list[ChangeRecord] = []
        for rk in keys:
            entry = state.get(rk[:-3], {}).get(_SLOT.unpack(rk[-2:])[0])
            out.append((rk, None if entry is None else _SEQ.pack(entry[0]) + entry[1]))
        return out

    def flush(self) -> None:
        self._state()

    def close(self) -> None:
        self._slots = None


class LatestEventsFactory(StorageEngineFactory):
    options_prefix = "latest"
    options_type = LatestEventsOptions
    description = "example non-KV engine: latest N events per key"

    def create(self, spec: StoreSpec, context: StoreContext) -> LatestEvents:
        return LatestEvents(context, spec.options)


# -- crash trials: how `localstate torture` drives this engine ----------------------------------
class LatestEventsWorkload(WorkloadAdapter):
    """The contrib ``latest_events`` engine: appends (and a few clears) per key."""

    store_options = {"key.serde": "string", "msg.serde": "string", "latest.size": 3}

    def apply_batch(self, store: Any, batch: int, rng: random.Random, ops: int, keys: int) -> None:
        for i in range(ops):
            k = f"k{rng.randrange(keys)}"
            if rng.random() < 0.05:
                store.clear(k)
            else:
                store.append(k, f"{batch}.{i}")

    def observe(self, store: Any, keys: int) -> dict[str, Any]:
        out = {}
        for i in range(keys):
            events = store.latest(f"k{i}")
            if events:
                out[f"k{i}"] = events
        return out


register_adapter("localstate.contrib.latest_events:LatestEventsFactory", LatestEventsWorkload)
