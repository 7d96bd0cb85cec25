"""The change record: the unit of localstate's one fault-tolerance path
(docs/design/protocol.md, "Words").

Every engine's durable state is expressed as change records: key-value engines log
``(key, value)``, a top-N heap ``(member, score)``, a HyperLogLog ``(register index,
value)``, a Bloom filter ``(word index, word)``, a full-text index ``(document id,
document)``. Change loggers append them to the changelog; ``restore`` replays them.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ChangeRecord", "apply_records"]

ChangeRecord = tuple[bytes, "bytes | None"]
"""``(key, value)``; a ``None`` value is a tombstone."""


def apply_records(records: Iterable[ChangeRecord], into: dict[bytes, bytes] | None = None) -> dict[bytes, bytes]:
    """The key-value state a run of change records leaves behind (last write wins, a
    tombstone removes): what compaction keeps and what a restore into a KV engine holds.
    Updates and returns ``into`` when given."""
    state: dict[bytes, bytes] = {} if into is None else into
    for k, v in records:
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    return state
