"""The ``hyperloglog`` engine: identical registers to datasketch, delta logging, bad input,
restore, stress vs a datasketch oracle (SIGKILL crash trials: tests/test_torture.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from datasketch import HyperLogLogPlusPlus
from localstate import Config, ConfigError, SerializationError, StoreClosedError, TaskStorage
from localstate.engines.hyperloglog import META_KEY, item_hash
from localstate.testing import FULL


def hll(p=10, **extra):
    return {"factory": "hyperloglog", "key.serde": "string", "hyperloglog.precision": p, **extra}


def reference(p, items):
    ref = HyperLogLogPlusPlus(p=p, hashfunc=item_hash)
    for x in items:
        ref.update(x)
    return ref


def test_registers_equal_datasketch_update_with_the_fixed_hash(make_config):
    items = [f"user-{i}" for i in range(5000)] + [b"raw-bytes", 42, "42", -7, bytearray(b"ba")]
    with TaskStorage(make_config(v=hll(12))) as s:
        v = s.store("v")
        v.add_all("batch", items)
        for x in items:
            v.add("single", x)
        v._check()
        ref = reference(12, items)
        assert np.array_equal(v.registers("batch"), ref.reg)
        assert np.array_equal(v.registers("single"), ref.reg)
        assert v.count("batch") == round(ref.count())
        assert v.sketch("batch") == ref and v.sketch("batch").hashfunc is item_hash
        assert abs(v.count("batch") - 5003) / 5003 < 0.05  # 42 and "42" are one item
        assert v.count("never") == 0 and "never" not in v and sorted(v.keys()) == ["batch", "single"]


def test_only_grown_registers_are_logged(make_config):
    with TaskStorage(make_config(v=hll(14))) as s:
        v = s.store("v")
        log = s.changelog("v")
        v.add_all("hot", [f"u{i}" for i in range(100_000)])
        s.commit()
        first = log.end_offset()
        assert first <= (1 << 14) + 1  # at most one record per register (+ the meta record)
        assert v.add_all("hot", [f"u{i}" for i in range(100_000)]) == 0  # nothing grows
        s.commit()
        assert log.end_offset() == first
        grew = v.add_all("hot", [f"new{i}" for i in range(50)])
        s.commit()
        records = list(log.read(first, log.end_offset()))
        assert 0 < len(records) == grew <= 50
        regs = v.registers("hot")
        for k, val in records:
            assert k[:-2] == b"hot" and val == bytes((regs[int.from_bytes(k[-2:], "big")],))
        assert dict(log.read(0, first))[META_KEY].startswith(b"hll++;xxh3_64")


def test_merge_delete_and_restore(make_config):
    config = make_config(v=hll(10))
    a_items = [f"a{i}" for i in range(300)]
    b_items = [f"b{i}" for i in range(300)] + a_items[:100]
    with TaskStorage(config) as s:
        v = s.store("v")
        v.add_all("page-a", a_items)
        v.add_all("page-b", b_items)
        v.merge_into("site", ["page-a", "page-b", "nobody"])
        v._check()
        assert np.array_equal(v.registers("site"), reference(10, a_items + b_items).reg)
        v.add_all("gone", ["x", "y"])
        s.commit()
        assert v.delete("gone") is True and v.delete("gone") is False
        s.commit()
        v.add("page-a", "uncommitted-viewer")
        expected = {k: v.registers(k) for k in ("page-a", "page-b", "site")}
        expected["page-a"] = reference(10, a_items).reg
    with TaskStorage(config) as s:
        v = s.store("v")
        v._check()
        assert sorted(v.keys()) == ["page-a", "page-b", "site"]
        for k, regs in expected.items():
            assert np.array_equal(v.registers(k), regs), k
        (rec,) = v.current([b"gone" + bytes(2)])
        assert rec == (b"gone" + bytes(2), None)


def test_bad_items_are_rejected_before_any_register_changes(make_config):
    config = make_config(v=hll(8))
    with TaskStorage(config) as s:
        v = s.store("v")
        v.add_all("k", ["a", "b"])
        s.commit()
        before = v.registers("k")
        with pytest.raises(SerializationError, match="store 'v'.*float"):
            v.add("k", 1.5)
        with pytest.raises(SerializationError, match="store 'v'.*NoneType"):
            v.add_all("k", ["c", "d", None])
        with pytest.raises(SerializationError, match="store 'v'.*bool"):
            v.add_all("k", [True])
        with pytest.raises(SerializationError, match="key serde 'string'"):
            v.add(7, "x")
        assert np.array_equal(v.registers("k"), before)
        v._check()


def test_precision_is_validated_and_a_changed_precision_refuses_to_restore(make_config):
    for p in (3, 17):
        with pytest.raises(ConfigError, match=f"stores.v.hyperloglog.precision = {p}: must be between 4 and 16"):
            make_config(v=hll(p))
    with TaskStorage(make_config(v=hll(10))) as s:
        s.store("v").add_all("k", ["a", "b", "c"])
        s.commit()
    with pytest.raises(ConfigError, match="stores.v.hyperloglog.precision = 12.*original precision"):
        TaskStorage(make_config(v=hll(12)))
    with TaskStorage(make_config(v=hll(10))) as s:  # nothing committed was lost
        assert s.store("v").count("k") == 3


def test_closed_engine_raises(make_config):
    s = TaskStorage(make_config(v=hll(8)))
    v = s.store("v")
    s.close()
    for call in (lambda: v.add("k", "x"), lambda: v.add_all("k", ["x"]), lambda: v.count("k"),
                 lambda: list(v.keys()), lambda: v.prepare_commit(), lambda: v.current([b"k\x00\x00"])):
        with pytest.raises(StoreClosedError, match="'v'"):
            call()
    v.close()


def test_stress_random_operations_match_a_datasketch_oracle(make_config):
    p = 8
    config = make_config(v=hll(p, **{"write.batch.size": 13}))
    rng = random.Random(5)
    oracle: dict[str, HyperLogLogPlusPlus] = {}
    keys = [f"k{i}" for i in range(6)]
    s = TaskStorage(config)
    v = s.store("v")
    steps = 2000 if FULL else 500
    try:
        for step in range(steps):
            r = rng.random()
            k = rng.choice(keys)
            if r < 0.4:
                x = rng.choice([f"s{rng.randrange(3000)}", rng.randrange(3000), b"b%d" % rng.randrange(3000)])
                v.add(k, x)
                oracle.setdefault(k, HyperLogLogPlusPlus(p=p, hashfunc=item_hash)).update(x)
            elif r < 0.7:
                xs = [f"s{rng.randrange(5000)}" for _ in range(rng.randrange(1, 200))]
                v.add_all(k, xs)
                o = oracle.setdefault(k, HyperLogLogPlusPlus(p=p, hashfunc=item_hash))
                for x in xs:
                    o.update(x)
            elif r < 0.78:
                others = rng.sample(keys, 2)
                v.merge_into(k, others)
                regs = [oracle[o].reg for o in others if o in oracle]
                if regs:
                    o = oracle.setdefault(k, HyperLogLogPlusPlus(p=p, hashfunc=item_hash))
                    o.reg = np.maximum.reduce([o.reg, *regs])
            elif r < 0.83:
                assert v.delete(k) == (oracle.pop(k, None) is not None)
            elif r < 0.95:
                s.commit()
            else:
                s.commit()
                s.close()
                s = TaskStorage(config)
                v = s.store("v")
            assert sorted(v.keys()) == sorted(oracle)
            for key, o in oracle.items():
                assert np.array_equal(v.registers(key), o.reg), (step, key)
            if step % 25 == 0:
                v._check()
    finally:
        s.close()


def test_the_docs_example_runs(capsys):
    """The usage example of docs/engines.md runs and prints what its comment says."""
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "engines.md").read_text()
    section = doc.split("\n## hyperloglog\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/engines.md (hyperloglog)", "exec"), {})
    out = capsys.readouterr().out
    assert out.strip(), "the example prints its result"
    home, site, keys = out.strip().split(" ", 2)
    assert abs(int(home) - 50_000) < 1500 and abs(int(site) - 60_000) < 1800
    assert keys == "['/home', '/pricing', 'site']"


@pytest.mark.kafka
def test_sketch_and_heap_engines_on_the_kafka_changelog_trim_an_uncommitted_tail(kafka_broker, tmp_path):
    """All three engines on a real Kafka-protocol broker: a durable but uncommitted tail is
    trimmed with each engine's current() records, on a fresh machine (empty state dir)."""
    import uuid

    job = f"special-{uuid.uuid4().hex[:8]}"
    values = {"job.name": job, "systems.kafka.bootstrap.servers": kafka_broker}
    for store, opts in {"v": hll(8), "b": {"factory": "bloom", "bloom.capacity": 1000},
                        "t": {"factory": "topn", "key.serde": "string", "topn.size": 3}}.items():
        values.update({f"stores.{store}.{k}": val for k, val in opts.items()})
        values[f"stores.{store}.changelog"] = f"kafka.{job}-{store}"

    def machine(name):
        return Config.from_dict({**values, "job.state.dir": str(tmp_path / name)})

    with TaskStorage(machine("m1")) as s:
        v, b, t = s.store("v"), s.store("b"), s.store("t")
        v.add_all("page", [f"u{i}" for i in range(500)])
        b.add_all([f"imp{i}" for i in range(300)])
        t.offer_all([("a", 1), ("b", 2), ("c", 3)])
        s.commit()
        committed = (v.registers("page"), b.words(), [tuple(e) for e in t.top()])
        v.add_all("page", [f"late{i}" for i in range(500)])
        v.add("other", "x")
        b.add_all([f"late{i}" for i in range(300)])
        t.offer("d", 10)
        for name in ("v", "b", "t"):  # make the tail durable without committing it
            s.engine(name).prepare_commit()
            s._stores[name].logger.flush()
    for name in ("m2", "m3"):  # m3 restores a log that now holds the trim records
        with TaskStorage(machine(name)) as s:
            v, b, t = s.store("v"), s.store("b"), s.store("t")
            assert np.array_equal(v.registers("page"), committed[0]) and list(v.keys()) == ["page"]
            assert np.array_equal(b.words(), committed[1])
            assert [tuple(e) for e in t.top()] == committed[2]
            s.commit()


def test_small_sketches_stay_sparse_and_grow_dense_with_identical_registers(make_config):
    config = make_config(v=hll(14))
    with TaskStorage(config) as s:
        v = s.store("v")
        engine = s.engine("v")
        for page in range(200):
            v.add_all(f"page{page}", [f"u{page}-{i}" for i in range(20)])
        v.add("page0", "one-more")
        assert all(type(sk) is dict for sk in engine._sketches.values())  # ~20 entries, not 16 KiB
        v.add_all("hot", [f"h{i}" for i in range(400)])
        assert type(engine._sketches[b"hot"]) is dict
        for i in range(400, 5000):  # single adds cross the sparse limit (1024 registers)
            v.add("hot", f"h{i}")
        assert type(engine._sketches[b"hot"]) is not dict
        v.merge_into("page1", ["hot"])  # a sparse target becomes dense through a merge
        v._check()
        assert np.array_equal(v.registers("hot"), reference(14, [f"h{i}" for i in range(5000)]).reg)
        assert np.array_equal(v.registers("page0"), reference(14, [f"u0-{i}" for i in range(20)] + ["one-more"]).reg)
        assert v.count("page5") == round(reference(14, [f"u5-{i}" for i in range(20)]).count())
        expected = {k: v.registers(k) for k in v.keys()}
        s.commit()
    with TaskStorage(config) as s:
        v = s.store("v")
        v._check()
        assert sorted(v.keys()) == sorted(expected)
        for k, regs in expected.items():
            assert np.array_equal(v.registers(k), regs), k
        assert type(s.engine("v")._sketches[b"page7"]) is dict
