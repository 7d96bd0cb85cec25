"""The ``topn`` engine: API contracts, bad input, restore, stress vs an oracle (SIGKILL crash trials: tests/test_torture.py)."""

from __future__ import annotations

import math
import random

import pytest
from localstate import (
    ConfigError,
    InvalidValueError,
    SerializationError,
    StoreClosedError,
    TaskStorage,
)
from localstate.engines.topn import Entry, decode_score, encode_score
from localstate.testing import FULL


def topn(size=3, order="max", **extra):
    return {"factory": "topn", "key.serde": "string", "msg.serde": "json", "topn.size": size,
            "topn.order": order, **extra}


def test_bounded_top_n_keeps_the_best_and_logs_evictions_as_tombstones(make_config):
    with TaskStorage(make_config(tr=topn(3))) as s:
        t = s.store("tr")
        assert t.offer("a", 5) and t.offer("b", 3) and t.offer("c", 9)
        t._check()
        assert t.offer("d", 1) is False  # worse than the worst kept: rejected, nothing logged
        assert t.offer("e", 7.5, {"title": "E"}) is True  # evicts b
        t._check()
        assert t.top() == [Entry("c", 9), Entry("e", 7.5, {"title": "E"}), Entry("a", 5)]
        assert t.top(1) == [Entry("c", 9)] and t.top(0) == []
        assert t.score("b") is None and t.score("e") == 7.5 and "a" in t and "b" not in t
        assert t.get("e") == Entry("e", 7.5, {"title": "E"}) and t.get("zz") is None
        assert t.offer("a", 1) is True  # a kept member's score is replaced, even downwards
        assert t.top()[-1] == Entry("a", 1)
        t._check()
        s.commit()
        log = s.changelog("tr")
        records = dict(log.read(0, log.end_offset()))
        assert records[b"b"] is None  # the eviction is a tombstone
        assert b"d" not in records  # the rejected offer never reached the changelog
        assert decode_score(records[b"e"]) == (7.5, b'{"title":"E"}')


def test_ties_break_by_member_bytes_and_int_scores_stay_exact(make_config):
    with TaskStorage(make_config(tr=topn(0))) as s:
        t = s.store("tr")
        big = (1 << 62) + 1
        t.offer_all([("b", 2), ("a", 2), ("c", big), ("d", 2.0)])
        assert [e.member for e in t.top()] == ["c", "a", "b", "d"]
        assert t.score("c") == big and type(t.score("c")) is int
        s.commit()
    with TaskStorage(make_config(tr=topn(0))) as s:
        assert s.store("tr").score("c") == big


def test_pop_and_pop_until_drain_in_order_for_bounded_sort(make_config):
    with TaskStorage(make_config(buf=topn(0, "min"))) as s:
        buf = s.store("buf")
        # a nearly sorted stream of (event id, timestamp): out of order by at most 3
        stream = [("e1", 1), ("e3", 3), ("e2", 2), ("e5", 5), ("e4", 4), ("e7", 7), ("e6", 6), ("e8", 8)]
        out = []
        for i, (event, ts) in enumerate(stream):
            buf.offer(event, ts)
            if i >= 3:
                out += [e.score for e in buf.pop_until(ts - 3)]
            buf._check()
        out += [e.score for e in buf.pop_until(10**9)]
        assert out == sorted(out) == list(range(1, 9))
        assert len(buf) == 0
        with pytest.raises(IndexError, match="empty top-N store 'buf'"):
            buf.pop()
        buf.offer_all([("x", 1), ("y", 2), ("z", 2)])
        assert [e.member for e in buf.pop_until(2, inclusive=False)] == ["x"]
        assert buf.pop() == Entry("y", 2)
        assert buf.remove("z") is True and buf.remove("z") is False
        buf._check()


def test_max_order_pop_until_takes_scores_at_or_above(make_config):
    with TaskStorage(make_config(tr=topn(0))) as s:
        t = s.store("tr")
        t.offer_all([("a", 1), ("b", 5), ("c", 3), ("d", 5)])
        assert [e.member for e in t.pop_until(3)] == ["b", "d", "c"]
        assert [e.member for e in t.top()] == ["a"]


@pytest.mark.parametrize("score", [math.nan, math.inf, -math.inf, True, "3", None, 1 << 63])
def test_bad_scores_are_rejected_and_nothing_committed_is_lost(make_config, score):
    config = make_config(tr=topn(3))
    with TaskStorage(config) as s:
        t = s.store("tr")
        t.offer("a", 1)
        s.commit()
        with pytest.raises(InvalidValueError, match="store 'tr'.*member 'b'"):
            t.offer("b", score)
        with pytest.raises(InvalidValueError):
            t.offer_all([("c", 2), ("b", score)])
        t._check()
        assert t.top() == [Entry("c", 2), Entry("a", 1)]  # offers before the bad one stay applied
        s.commit()
    with TaskStorage(config) as s:
        assert s.store("tr").top() == [Entry("c", 2), Entry("a", 1)]


def test_bad_members_payloads_and_options_give_clear_errors(make_config):
    with TaskStorage(make_config(tr=topn(3))) as s:
        t = s.store("tr")
        with pytest.raises(SerializationError, match="store 'tr'.*key serde 'string'.*stores.tr.key.serde"):
            t.offer(42, 1)
        with pytest.raises(SerializationError, match="store 'tr'"):
            t.offer("a", 1, payload=object())
        with pytest.raises(InvalidValueError, match="k >= 0"):
            t.top(-1)
        assert len(t) == 0
    with pytest.raises(ConfigError, match="stores.tr.topn.size = -1"):
        make_config(tr=topn(-1))
    with pytest.raises(ConfigError, match="stores.tr.topn.order"):
        make_config(tr=topn(3, "biggest"))
    with pytest.raises(ConfigError, match="stores.tr.topn.capacity. Valid options: order, size"):
        make_config(tr={"factory": "topn", "topn.capacity": 3})


def test_closed_engine_raises(make_config):
    s = TaskStorage(make_config(tr=topn(3)))
    t = s.store("tr")
    s.close()
    for call in (lambda: t.offer("a", 1), lambda: t.top(), lambda: len(t), lambda: t.pop(),
                 lambda: t.current([b"a"]), lambda: t.restore([])):
        with pytest.raises(StoreClosedError, match="'tr'"):
            call()
    t.close()  # idempotent


def test_restore_drops_uncommitted_and_current_reports_committed(make_config):
    config = make_config(tr=topn(3, changelog="file.tr"))
    with TaskStorage(config) as s:
        t = s.store("tr")
        t.offer_all([("a", 1), ("b", 2), ("c", 3)])
        s.commit()
        t.offer("d", 10)  # evicts a, uncommitted
        t.remove("b")
        # force the uncommitted records into the changelog tail (as a batch drain would)
        s.engine("tr").prepare_commit()
        s._stores["tr"].logger.flush()
    with TaskStorage(config) as s:
        t = s.store("tr")
        assert [e.member for e in t.top()] == ["c", "b", "a"]
        t._check()
        current = dict(t.current([b"a", b"d"]))
        assert current == {b"a": encode_score(1, None), b"d": None}


def test_capacity_shrink_evicts_on_reopen_and_logs_tombstones_at_commit(make_config):
    with TaskStorage(make_config(tr=topn(5))) as s:
        s.store("tr").offer_all([(m, i) for i, m in enumerate("abcde")])
        s.commit()
    with TaskStorage(make_config(tr=topn(2))) as s:
        t = s.store("tr")
        assert [e.member for e in t.top()] == ["e", "d"]
        t._check()
        s.commit()
    with TaskStorage(make_config(tr=topn(5))) as s:
        assert [e.member for e in s.store("tr").top()] == ["e", "d"]


class Oracle:
    """The simplest possible top-N: a dict, sorted on demand."""

    def __init__(self, size: int, order: str) -> None:
        self.size, self.sign, self.d = size, -1 if order == "max" else 1, {}

    def ranked(self):
        return sorted(self.d.items(), key=lambda kv: (self.sign * kv[1], kv[0].encode()))

    def offer(self, m, score):
        if m not in self.d and self.size and len(self.d) >= self.size:
            worst = self.ranked()[-1]
            if (self.sign * score, m.encode()) >= (self.sign * worst[1], worst[0].encode()):
                return False
            del self.d[worst[0]]
        self.d[m] = score
        return True

    def pop_until(self, w):
        out = [kv for kv in self.ranked() if self.sign * kv[1] <= self.sign * w]
        for m, _ in out:
            del self.d[m]
        return out


@pytest.mark.parametrize("size, order", [(10, "max"), (0, "min"), (1, "max")])
def test_stress_random_operations_match_an_oracle(make_config, size, order):
    config = make_config(tr=topn(size, order, **{"write.batch.size": 7}))
    rng = random.Random(size * 31 + len(order))
    oracle = Oracle(size, order)
    steps = 6000 if FULL else 1000
    s = TaskStorage(config)
    t = s.store("tr")
    try:
        for step in range(steps):
            r = rng.random()
            m = f"m{rng.randrange(40)}"
            if r < 0.45:
                score = rng.choice([rng.randrange(-50, 50), rng.uniform(-50, 50)])
                assert t.offer(m, score) == oracle.offer(m, score)
            elif r < 0.6:  # the batch path, with its cached-worst rejection
                batch = [(f"m{rng.randrange(40)}", rng.randrange(-50, 50)) for _ in range(rng.randrange(1, 8))]
                assert t.offer_all(batch) == sum(oracle.offer(bm, bs) for bm, bs in batch)
            elif r < 0.7:
                assert t.remove(m) == (oracle.d.pop(m, None) is not None)
            elif r < 0.75 and oracle.d:
                best = oracle.ranked()[0]
                del oracle.d[best[0]]
                assert t.pop()[:2] == best
            elif r < 0.8:
                w = rng.randrange(-50, 50)
                assert [e[:2] for e in t.pop_until(w)] == oracle.pop_until(w)
            elif r < 0.9:
                assert t.score(m) == oracle.d.get(m)
            elif r < 0.97:
                s.commit()
            else:  # crash-free reopen: the state equals the last commit, then continue
                committed = [e[:2] for e in t.top()]
                s.commit()
                s.close()
                s = TaskStorage(config)
                t = s.store("tr")
                assert [e[:2] for e in t.top()] == committed
            assert [e[:2] for e in t.top()] == oracle.ranked()
            if step % 50 == 0:
                t._check()
    finally:
        s.close()


def test_the_docs_example_runs(capsys):
    """The usage example of docs/engines.md runs and prints what its comment says."""
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "engines.md").read_text()
    section = doc.split("\n## topn\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/engines.md (topn)", "exec"), {})
    out = capsys.readouterr().out
    assert out.strip(), "the example prints its result"
    assert out.strip() == "[('/blog/rust', 300), ('/home', 120), ('/docs', 80)]"
