"""Shared fixtures: configs on temporary directories, the Kafka broker and Spark session
plug-ins. Long tests scale with :data:`localstate.testing.FULL`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from localstate import Config

pytest_plugins = ["localstate.testing.kafka", "localstate.testing.spark", "localstate.testing.s3",
                  "localstate.testing.hdfs"]



@pytest.fixture
def make_config(tmp_path: Path) -> Any:
    """``make_config(**stores)`` → a Config with state and changelog under tmp_path.

    ``make_config(counts={"factory": "memory", "msg.serde": "json"}, **{"job.partitions": 2})``
    """

    def make(extra: dict[str, Any] | None = None, **stores: dict[str, Any]) -> Config:
        values: dict[str, Any] = {
            "job.name": "test",
            "job.state.dir": str(tmp_path / "state"),
            "systems.file.path": str(tmp_path / "changelog"),
        }
        for name, opts in stores.items():
            for k, v in opts.items():
                values[f"stores.{name}.{k}"] = v
        values.update(extra or {})
        return Config.from_dict(values)

    return make
