"""What a state server answers (:mod:`localstate.serving`): lookups, key metadata, task
status, its errors, and how keys are read from text and values written as JSON."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, InvalidValueError, LocalStateError

__all__ = [
    "Lookup",
    "KeyMetadata",
    "TaskStatus",
    "NotLocalError",
    "UnavailableError",
    "UnknownStoreError",
    "parse_key",
    "json_default",
    "HOP_HEADER",
    "MAX_RANGE_LIMIT",
    "SERVING",
    "BUILDING",
    "NOTHING_COMMITTED",
    "FAILED",
]

HOP_HEADER = "X-Localstate-Forwarded"
"""Set on a request one server forwards to another (:mod:`localstate.serving_http`): the
receiver answers it itself or refuses (421), so a request never travels on (two servers
whose routes disagree cannot loop)."""
MAX_RANGE_LIMIT = 10_000
"""The most keys a range request returns (a range is for dashboards, not for dumps)."""

SERVING = "serving"
BUILDING = "building"
NOTHING_COMMITTED = "nothing committed"
FAILED = "failed"


class NotLocalError(LocalStateError):
    """The key's task is not held by this server; ``partition`` is its task and ``server``
    the base URL of the server that holds it (None: no route is known)."""

    def __init__(self, message: str, partition: int, server: str | None) -> None:
        super().__init__(message)
        self.partition = partition
        self.server = server


class UnknownStoreError(ConfigError, LookupError):
    """The job has no store of that name."""


class UnavailableError(LocalStateError):
    """The task's copy is not served now (being built, rebuilt after damage, or the task has
    not committed yet); try again shortly."""


def parse_key(text: str, serde: str, store: str) -> Any:
    """A key typed as text (a URL path, a command line) as the store's key serde wants it:
    the text for ``string``, its UTF-8 bytes for ``bytes``, a number for ``int``/``long``,
    JSON for the others (a JSON list is a tuple for ``tuple``). :class:`InvalidValueError`
    naming the store and the serde when it does not parse."""
    if serde == "string":
        return text
    if serde == "bytes":
        return text.encode()
    try:
        if serde in ("int", "long"):
            return int(text)
        value = json.loads(text)
    except ValueError as e:
        raise InvalidValueError(f"{text!r} is not a key of store {store!r} (key.serde {serde!r}): {e}") from e
    return tuple(value) if serde == "tuple" and isinstance(value, list) else value


def json_default(obj: Any) -> Any:
    """``json.dumps`` ``default`` for state values: bytes as ``{"base64": ...}``, anything
    else JSON cannot say as its ``repr``."""
    if isinstance(obj, (bytes, bytearray)):
        return {"base64": base64.b64encode(bytes(obj)).decode()}
    return repr(obj)


@dataclass(frozen=True)
class Lookup:
    """The answer to a point lookup: ``value`` (None when ``found`` is False) as of commit
    ``version`` of task ``partition``."""

    store: str
    key: Any
    value: Any
    found: bool
    partition: int
    version: int

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "key": self.key, "value": self.value, "found": self.found,
                "partition": self.partition, "version": self.version}


@dataclass(frozen=True)
class KeyMetadata:
    """Where a key lives (Kafka Streams' ``queryMetadataForKey``): its task, the base URL of
    the server that holds that task (None: no route known), whether that is this server,
    and the version this server's copy holds (None when not local or not ready)."""

    store: str
    key: Any
    partition: int
    server: str | None
    local: bool
    version: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"store": self.store, "key": self.key, "partition": self.partition, "server": self.server,
                "local": self.local, "version": self.version}


@dataclass(frozen=True)
class TaskStatus:
    """One task copy of a server: the committed ``version`` it serves (None: not served),
    ``status`` (``serving``, ``building``, ``nothing committed``, ``failed``) and the last
    error, if any."""

    partition: int
    status: str
    version: int | None
    error: str | None = None
    stores: dict[str, int] = field(default_factory=dict)
    """The changelog offset each store's copy equals."""

    def to_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "status": self.status, "version": self.version,
                "error": self.error, "stores": dict(self.stores)}
