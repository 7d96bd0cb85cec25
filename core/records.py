"""The change record: the unit of localstate's one fault-tolerance path (DESIGN §2).

Every engine's durable state is expressed as change records: key-value engines log
``(key, value)``, a top-N heap ``(member, score)``, a HyperLogLog ``(register index,
value)``, a Bloom filter ``(word index, word)``, a full-text index ``(document id,
document)``. Change loggers append them to the changelog; ``restore`` replays them.
"""

from __future__ import annotations

__all__ = ["ChangeRecord"]

ChangeRecord = tuple[bytes, "bytes | None"]
"""``(key, value)``; a ``None`` value is a tombstone."""
