"""The ``stores.<name>.rocksdb.*`` options of the ``rocksdb`` engine, and how they become
``rocksdict`` settings (and RocksDB's statistics dump becomes counters)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import rocksdict
from localstate.errors import ConfigError

__all__ = ["RocksDBOptions", "statistics_counts"]

_COMPRESSION = {
    "none": rocksdict.DBCompressionType.none,
    "snappy": rocksdict.DBCompressionType.snappy,
    "lz4": rocksdict.DBCompressionType.lz4,
    "zstd": rocksdict.DBCompressionType.zstd,
    "zlib": rocksdict.DBCompressionType.zlib,
}


@dataclass(frozen=True)
class RocksDBOptions:
    """``stores.<name>.rocksdb.*`` options (defaults follow Kafka Streams' RocksDB setup).

    * ``block.cache.size.bytes`` — LRU block cache per store (default 50 MiB).
    * ``block.size.bytes`` — data block size (default 4096).
    * ``write.buffer.size.bytes`` — memtable size before a flush (default 16 MiB).
    * ``max.write.buffer.number`` — memtables kept before writes stall (default 3).
    * ``compression`` — ``lz4`` (default), ``zstd``, ``snappy``, ``zlib`` or ``none``.
    * ``bloom.bits.per.key`` — bloom filter bits per key, ``0`` disables (default 10).
    * ``max.open.files`` — table files kept open, ``-1`` = unlimited (default -1).
    * ``background.jobs`` — flush/compaction threads (default 2).
    * ``snapshots.keep`` — local checkpoints kept for incremental restore (default 2;
      at least 2, so the last committed one survives a failed commit).
    * ``snapshot.interval.records`` — a commit takes a local snapshot once this many
      records were written since the last one (default 500,000; ``0`` = at every
      commit). Bounds what a reopen after a crash replays from the changelog.
    * ``statistics`` — collect RocksDB's statistics (default ``false``): adds the block
      cache hit/miss counters to the store's metrics (``localstate_engine_*``) at the
      cost RocksDB documents for statistics (a few percent on reads).
    * ``restore.mode`` — how a full restore into an empty store loads the changelog:
      ``batch`` (default) applies it in order through write batches (no WAL: the
      restore ends with a flush and a snapshot), streaming in bounded memory;
      ``sst`` dedupes and sorts chunks of 2M records and ingests them as SST files
      (the data arrives compacted, at the cost of the sort and of holding a chunk in
      memory). ``batch`` measured faster on the reference machine
      (benchmarks/RESULTS.md: the A/B of the two restore modes).
    """

    block_cache_size_bytes: int = 50 * 1024 * 1024
    block_size_bytes: int = 4096
    write_buffer_size_bytes: int = 16 * 1024 * 1024
    max_write_buffer_number: int = 3
    compression: Literal["none", "snappy", "lz4", "zstd", "zlib"] = "lz4"
    bloom_bits_per_key: float = 10.0
    max_open_files: int = -1
    background_jobs: int = 2
    snapshots_keep: int = 2
    snapshot_interval_records: int = 500_000
    restore_mode: Literal["batch", "sst"] = "batch"
    statistics: bool = False

    def validate(self, prefix: str) -> None:
        """Raise :class:`ConfigError` naming the full key of the first bad value."""
        checks = (
            ("block.cache.size.bytes", self.block_cache_size_bytes >= 0, ">= 0"),
            ("block.size.bytes", self.block_size_bytes >= 256, ">= 256"),
            ("write.buffer.size.bytes", self.write_buffer_size_bytes >= 64 * 1024, ">= 65536"),
            ("max.write.buffer.number", self.max_write_buffer_number >= 2, ">= 2"),
            ("bloom.bits.per.key", 0 <= self.bloom_bits_per_key <= 64, "between 0 and 64"),
            ("max.open.files", self.max_open_files == -1 or self.max_open_files >= 16, "-1 (unlimited) or >= 16"),
            ("background.jobs", 1 <= self.background_jobs <= 64, "between 1 and 64"),
            ("snapshots.keep", self.snapshots_keep >= 2, ">= 2"),
            ("snapshot.interval.records", self.snapshot_interval_records >= 0, ">= 0"),
        )
        for key, ok, rule in checks:
            if not ok:
                value = getattr(self, key.replace(".", "_"))
                raise ConfigError(f"{prefix}.{key} = {value!r}: must be {rule}")

    def to_native(self) -> rocksdict.Options:
        """A new ``rocksdict.Options`` in raw (bytes) mode with these settings."""
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        table = rocksdict.BlockBasedOptions()
        if self.block_cache_size_bytes > 0:
            table.set_block_cache(rocksdict.Cache(self.block_cache_size_bytes))
        else:
            table.disable_cache()
        table.set_block_size(self.block_size_bytes)
        if self.bloom_bits_per_key > 0:
            table.set_bloom_filter(self.bloom_bits_per_key, False)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_size(self.write_buffer_size_bytes)
        opts.set_max_write_buffer_number(self.max_write_buffer_number)
        opts.set_compression_type(_COMPRESSION[self.compression]())
        opts.set_max_open_files(self.max_open_files)
        opts.set_max_background_jobs(self.background_jobs)
        opts.set_keep_log_file_num(2)
        if self.statistics:
            opts.enable_statistics()
        return opts


def statistics_counts(text: str) -> dict[str, int]:
    """The ``NAME COUNT : N`` tickers of RocksDB's statistics dump."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(" COUNT : ")
        if sep:
            try:
                out[name.strip()] = int(rest.split()[0])
            except (ValueError, IndexError):
                continue
    return out
