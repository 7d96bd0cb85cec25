"""The ``bloom`` engine: no false negatives, measured FP rate, changed-word logging, keyed
filters, bad input, restore, stress vs an exact-set oracle (crash trials: tests/test_torture.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from localstate import (
    ConfigError,
    InvalidValueError,
    SerializationError,
    StoreClosedError,
    TaskStorage,
)
from localstate.engines.bloom import META_KEY, blocked_fp_rate, bloom_geometry
from localstate.testing import FULL


def bloom(capacity=10_000, fp=0.01, keyed=False, **extra):
    return {"factory": "bloom", "key.serde": "string", "bloom.capacity": capacity, "bloom.fp.rate": fp,
            "bloom.keyed": keyed, **extra}


def test_geometry_meets_the_rate_and_is_minimal():
    for n, p in [(1000, 0.01), (100_000, 0.001), (10, 0.5), (1_000_000, 1e-6)]:
        words, k = bloom_geometry(n, p)
        assert 1 <= k <= 10
        assert blocked_fp_rate(n, words, k) <= p
        assert words == 1 or all(p < blocked_fp_rate(n, words - 1, kk) for kk in range(1, 11))


@pytest.mark.parametrize("fp", [0.01, 0.001])
def test_no_false_negatives_and_the_measured_fp_rate_matches(make_config, fp):
    n = 50_000
    with TaskStorage(make_config(b=bloom(n, fp))) as s:
        b = s.store("b")
        items = [f"imp-{i}" for i in range(n)]
        b.add_all(items)
        b._check()
        assert b.might_contain_all(items).all()
        assert all(x in b for x in items[:500])
        probes = [f"other-{i}" for i in range(200_000)]
        rate = b.might_contain_all(probes).mean()
        assert rate < fp * 1.3, rate  # 200k probes: the sampling error is well under 30%
        assert rate > fp * 0.5, rate
        single = [b.might_contain(x) for x in probes[:2000]]
        assert single == b.might_contain_all(probes[:2000]).tolist()


def test_single_adds_and_batches_set_the_same_bits_and_add_reports_newness(make_config):
    with TaskStorage(make_config(a=bloom(1000), b=bloom(1000))) as s:
        a, b = s.store("a"), s.store("b")
        items = [f"x{i}" for i in range(800)] + [b"raw", 17, "17"]
        a.add_all(items)
        for x in items:
            b.add(x)
        assert np.array_equal(a.words(), b.words())
        assert b.add("fresh-item") is True and b.add("fresh-item") is False
        assert b.might_contain(17) and b.might_contain("17")  # 17 and "17" are one item


def test_only_changed_words_are_logged(make_config):
    with TaskStorage(make_config(b=bloom(100_000))) as s:
        b = s.store("b")
        log = s.changelog("b")
        b.add_all([f"x{i}" for i in range(1000)])
        s.commit()
        first = log.end_offset()
        assert first <= 1000 + 1  # an item changes one word (+ the meta record)
        b.add_all([f"x{i}" for i in range(1000)])  # nothing new
        s.commit()
        assert log.end_offset() == first
        b.add("one-more")
        s.commit()
        records = list(log.read(first, log.end_offset()))
        assert len(records) == 1
        words = b.words()
        for k, v in records:
            assert len(k) == 4 and int.from_bytes(v, "big") == int(words[int.from_bytes(k, "big")])
        assert dict(log.read(0, first))[META_KEY].startswith(b"bloom;blocked64;xxh3_64")


def test_keyed_filters_restore_and_delete(make_config):
    config = make_config(b=bloom(500, keyed=True))
    with TaskStorage(config) as s:
        b = s.store("b")
        b.add_all(["ad1", "ad2"], key="user-a")
        b.add("ad3", key="user-b")
        b.add("ad9", key="gone")
        assert b.might_contain("ad1", key="user-a") and not b.might_contain("ad1", key="nobody")
        assert ("user-b", "ad3") in b and ("user-a", "ad3") not in b
        s.commit()
        assert b.delete(key="gone") is True and b.delete(key="gone") is False
        s.commit()
        b.add("uncommitted", key="user-a")
        expected = {k: b.words(key=k) for k in ("user-a", "user-b")}
        expected["user-a"] = None
    with TaskStorage(config) as s:
        b = s.store("b")
        b._check()
        assert sorted(b.keys()) == ["user-a", "user-b"] and len(b) == 2
        assert np.array_equal(b.words(key="user-b"), expected["user-b"])
        assert b.might_contain("ad2", key="user-a") and not b.might_contain("ad9", key="gone")
        assert b.might_contain_all(["ad1", "ad2"], key="user-a").all()


def test_bad_input_and_options_give_clear_errors(make_config):
    config = make_config(b=bloom(1000))
    with TaskStorage(config) as s:
        b = s.store("b")
        b.add("a")
        s.commit()
        before = b.words()
        with pytest.raises(SerializationError, match="store 'b'.*float"):
            b.add(1.5)
        with pytest.raises(SerializationError, match="store 'b'.*dict"):
            b.add_all(["x", "y", {"z": 1}])
        with pytest.raises(SerializationError, match="store 'b'"):
            b.might_contain(None)
        with pytest.raises(InvalidValueError, match="stores.b.bloom.keyed = true"):
            b.add("x", key="k")
        assert np.array_equal(b.words(), before)
    with TaskStorage(make_config(k=bloom(10, keyed=True))) as s:
        with pytest.raises(InvalidValueError, match="pass key="):
            s.store("k").add("x")
        with pytest.raises(InvalidValueError, match=r"\(key, item\) in store"):
            _ = "x" in s.store("k")
    for opts, msg in [({"bloom.capacity": 0}, "stores.b.bloom.capacity = 0"),
                      ({"bloom.fp.rate": 1.0}, "stores.b.bloom.fp.rate = 1.0: must be strictly between 0 and 1"),
                      ({"bloom.fp.rate": 0}, "stores.b.bloom.fp.rate = 0.0"),
                      ({"bloom.fp.rate": "abc"}, "stores.b.bloom.fp.rate")]:
        with pytest.raises(ConfigError, match=msg):
            make_config(b={**bloom(), **opts})


def test_changed_geometry_refuses_to_restore_and_loses_nothing(make_config):
    with TaskStorage(make_config(b=bloom(1000))) as s:
        s.store("b").add_all(["a", "b"])
        s.commit()
    with pytest.raises(ConfigError, match="stores.b.bloom.capacity = 5000.*original capacity"):
        TaskStorage(make_config(b=bloom(5000)))
    with pytest.raises(ConfigError, match="keyed"):
        TaskStorage(make_config(b=bloom(1000, keyed=True)))
    with TaskStorage(make_config(b=bloom(1000))) as s:
        assert s.store("b").might_contain_all(["a", "b"]).all()


def test_closed_engine_raises(make_config):
    s = TaskStorage(make_config(b=bloom(100)))
    b = s.store("b")
    s.close()
    for call in (lambda: b.add("x"), lambda: b.add_all(["x"]), lambda: b.might_contain("x"),
                 lambda: "x" in b, lambda: b.prepare_commit(), lambda: b.current([bytes(4)])):
        with pytest.raises(StoreClosedError, match="'b'"):
            call()
    b.close()


def test_stress_random_operations_against_an_exact_set(make_config):
    config = make_config(b=bloom(2000, 0.01, keyed=True, **{"write.batch.size": 11}))
    rng = random.Random(11)
    oracle: dict[str, set[str]] = {}
    shadow: dict[str, np.ndarray] = {}  # the committed words, to check restores bit for bit
    s = TaskStorage(config)
    b = s.store("b")
    steps = 1500 if FULL else 400
    false_pos = probes = 0
    try:
        for step in range(steps):
            r = rng.random()
            k = f"k{rng.randrange(4)}"
            if r < 0.35:
                x = f"i{rng.randrange(3000)}"
                was = x in oracle.get(k, ())
                if b.add(x, key=k) is True:
                    assert not was, "add() said new for an item already added"
                oracle.setdefault(k, set()).add(x)
            elif r < 0.6:
                xs = [f"i{rng.randrange(3000)}" for _ in range(rng.randrange(1, 100))]
                b.add_all(xs, key=k)
                oracle.setdefault(k, set()).update(xs)
            elif r < 0.85:
                xs = [f"i{rng.randrange(3000)}" for _ in range(50)]
                got = b.might_contain_all(xs, key=k)
                want = [x in oracle.get(k, ()) for x in xs]
                assert all(g or not w for g, w in zip(got, want)), "false negative"
                false_pos += int(sum(g and not w for g, w in zip(got, want)))
                probes += sum(not w for w in want)
            elif r < 0.88:
                assert b.delete(key=k) == (oracle.pop(k, None) is not None)
            elif r < 0.97:
                s.commit()
                shadow = {key: b.words(key=key) for key in oracle}
            else:
                s.commit()
                shadow = {key: b.words(key=key) for key in oracle}
                s.close()
                s = TaskStorage(config)
                b = s.store("b")
                assert sorted(b.keys()) == sorted(shadow)
                for key, words in shadow.items():
                    assert np.array_equal(b.words(key=key), words)
            if step % 25 == 0:
                b._check()
        assert probes and false_pos / probes < 0.03
    finally:
        s.close()


def test_the_docs_example_runs(capsys):
    """The usage example of docs/engines.md runs and prints what its comment says."""
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "engines.md").read_text()
    section = doc.split("\n## bloom\n", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/engines.md (bloom)", "exec"), {})
    out = capsys.readouterr().out
    assert out.strip(), "the example prints its result"
    assert out.splitlines() == ["['imp-1', 'imp-2', 'imp-3']", "True [True, False]"]
