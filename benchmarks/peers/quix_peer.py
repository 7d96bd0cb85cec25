"""The Quix Streams peer of the Kafka end-to-end shape, run as a script.

``python quix_peer.py BOOTSTRAP TOPIC MESSAGES STATE_DIR RESULT_JSON``: a Quix Streams
``Application`` with ``processing_guarantee="exactly-once"`` reads ``TOPIC`` from the
start (a fresh consumer group), counts messages per key in its RocksDB state (with its
changelog topic), and stops after ``MESSAGES`` messages. It writes
``{"seconds", "messages", "counts"}`` to ``RESULT_JSON``: ``seconds`` runs from the
first message processed to ``run()`` returning (its final exactly-once commit and close
included; the consumer-group join before the first message is not), ``counts`` the
last count the state returned per key (what the benchmark compares with localstate).

It imports only the standard library and quixstreams, so it runs in a separate
environment when quixstreams cannot share localstate's (quixstreams 3.28 pins
``confluent-kafka<2.13``).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def main(argv: list[str]) -> None:
    bootstrap, topic_name, messages, state_dir, result_path = argv
    total = int(messages)
    from quixstreams import Application

    app = Application(
        broker_address=bootstrap,
        consumer_group=f"quix-peer-{time.time_ns()}",
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        state_dir=state_dir,
        loglevel="WARNING",
        # tansu holds the first JoinGroup for half the session timeout
        consumer_extra_config={"session.timeout.ms": 6000},
    )
    topic = app.topic(topic_name, value_deserializer="json", key_deserializer="str")
    counts: dict[str, int] = {}
    first: list[float] = []

    def count(value: Any, key: Any, timestamp: int, headers: Any, state: Any) -> int:
        if not first:
            first.append(time.perf_counter())
        n = state.get("views", 0) + 1
        state.set("views", n)
        counts[key] = n
        return n

    app.dataframe(topic).apply(count, stateful=True, metadata=True)
    app.run(count=total, collect=False)
    seconds = time.perf_counter() - first[0] if first else 0.0
    with open(result_path, "w") as f:
        json.dump({"seconds": seconds, "messages": sum(counts.values()), "counts": counts}, f)


if __name__ == "__main__":
    main(sys.argv[1:])
