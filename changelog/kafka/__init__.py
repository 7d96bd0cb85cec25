"""The Kafka changelog: a compacted topic per stream, checkpoints committed in the same
transaction as the records, and the one Kafka client every part of localstate uses.

The names below are imported on first use, so importing one submodule (e.g. the Kafka
client from a Spark data source) does not import the whole system."""

from __future__ import annotations

from typing import TYPE_CHECKING

from localstate.lazy import lazy_exports

if TYPE_CHECKING:
    from .checkpoints import KafkaCheckpointStore
    from .client import KafkaSettings
    from .partition import KafkaChangelogPartition
    from .system import KafkaChangelogSystem

__all__ = ["KafkaChangelogSystem", "KafkaChangelogPartition", "KafkaCheckpointStore", "KafkaSettings"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "KafkaChangelogSystem": ".system",
    "KafkaChangelogPartition": ".partition",
    "KafkaCheckpointStore": ".checkpoints",
    "KafkaSettings": ".client",
})
