"""What a windowed aggregation (:mod:`localstate.windows`) computes: the window kinds
(:class:`Tumbling`, :class:`Hopping`, :class:`Sliding`, :class:`Session`, as Kafka
Streams defines them) and the aggregates that fold a window's records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

__all__ = [
    "Windows", "Tumbling", "Hopping", "Sliding", "Session",
    "Aggregator", "Aggregate", "Count", "Sum", "Min", "Max", "Reduce",
]


def _ms(value: Any, what: str, *, minimum: int) -> int:
    if type(value) is not int:
        raise ConfigError(f"{what} must be an int (in the event-time unit, e.g. ms), got {value!r} "
                          f"({type(value).__name__})")
    if value < minimum:
        raise ConfigError(f"{what} must be >= {minimum}, got {value}")
    return value


# -- window kinds ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Windows:
    """What all window kinds share: ``grace`` (keyword-only), how long after its end a
    window still takes records (Kafka's grace period, Flink's allowed lateness)."""

    grace: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        _ms(self.grace, f"{type(self).__name__}: grace", minimum=0)


@dataclass(frozen=True)
class Tumbling(Windows):
    """Fixed, non-overlapping windows ``[start, start + size)``, ``start`` a multiple of ``size``."""

    size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _ms(self.size, "Tumbling: size", minimum=1)

    @property
    def hop(self) -> int:
        return self.size


@dataclass(frozen=True)
class Hopping(Windows):
    """Overlapping windows ``[start, start + size)``, ``start`` a multiple of ``hop``."""

    size: int
    hop: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _ms(self.size, "Hopping: size", minimum=1)
        _ms(self.hop, "Hopping: hop", minimum=1)
        if self.hop > self.size:
            raise ConfigError(f"Hopping: hop ({self.hop}) must be <= size ({self.size}); a hop larger than "
                              "the window would leave gaps no window covers")


@dataclass(frozen=True)
class Sliding(Windows):
    """Per key, the window ``[t - size, t]`` ending at each distinct event time ``t``."""

    size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _ms(self.size, "Sliding: size", minimum=1)


@dataclass(frozen=True)
class Session(Windows):
    """Per key, runs of records less than ``gap`` apart (``[first, last]``)."""

    gap: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _ms(self.gap, "Session: gap", minimum=1)


# -- aggregates -----------------------------------------------------------------------------------
class Aggregator:
    """How a window folds its records: ``initial()`` → ``add(acc, value)`` per record,
    ``merge(a, b)`` (sessions that merge, sliding windows), ``result(acc)`` when emitted.
    The accumulator must fit the store's value serde. ``arrow`` names the Arrow
    ``group_by`` aggregation that computes the same fold (the vectorised path), or None."""

    arrow: str | None = None
    merges = True
    """Whether :meth:`merge` is defined (session and sliding windows need it)."""

    def initial(self) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, value: Any) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no merge(); session and sliding windows need one")

    def result(self, acc: Any) -> Any:
        return acc


class Count(Aggregator):
    """The number of records (their values are ignored)."""

    arrow = "sum"  # of ones

    def initial(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b


class Sum(Aggregator):
    """The sum of the values (``None`` values are skipped)."""

    arrow = "sum"

    def initial(self) -> Any:
        return 0

    def add(self, acc: Any, value: Any) -> Any:
        return acc if value is None else acc + value

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


class _Extreme(Aggregator):
    pick: Callable[[Any, Any], Any]

    def initial(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        if value is None:
            return acc
        return value if acc is None else type(self).pick(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        return self.add(a, b)


class Min(_Extreme):
    """The smallest value (``None`` values are skipped)."""

    arrow = "min"
    pick = min


class Max(_Extreme):
    """The largest value (``None`` values are skipped)."""

    arrow = "max"
    pick = max


class Reduce(Aggregator):
    """Kafka Streams' ``reduce``: the first value, then ``fn(acc, value)`` per record;
    ``fn`` also merges two sessions."""

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def initial(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return value if acc is None else self.fn(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else self.fn(a, b)


class Aggregate(Aggregator):
    """Kafka Streams' ``aggregate(initializer, aggregator[, session merger])``: the
    accumulator starts as ``initializer()``, each record makes it ``adder(acc, value)``;
    ``merger(a, b)`` joins two (needed by session and sliding windows); ``result(acc)``
    turns it into the emitted value (default: the accumulator itself)."""

    def __init__(self, initializer: Callable[[], Any], adder: Callable[[Any, Any], Any],
                 merger: Callable[[Any, Any], Any] | None = None,
                 result: Callable[[Any], Any] | None = None) -> None:
        self.initializer, self.adder, self.merger, self.finish = initializer, adder, merger, result
        self.merges = merger is not None

    def initial(self) -> Any:
        return self.initializer()

    def add(self, acc: Any, value: Any) -> Any:
        return self.adder(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        if self.merger is None:
            return super().merge(a, b)
        return self.merger(a, b)

    def result(self, acc: Any) -> Any:
        return acc if self.finish is None else self.finish(acc)
