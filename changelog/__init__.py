"""Changelog backends: ``file`` (embedded default) and ``kafka``; the shared contract in ``base``."""

from __future__ import annotations

from .base import ChangelogPartition, ChangelogSystem, CheckpointStore

__all__ = ["ChangelogPartition", "ChangelogSystem", "CheckpointStore"]
