"""The one error hierarchy of localstate.

Every backend error is translated into one of these in one place per backend and
raised ``from`` the original, with a message naming the store, the path and the fix.
"""

from __future__ import annotations

__all__ = [
    "LocalStateError",
    "ConfigError",
    "UnknownEngineError",
    "UnknownSystemError",
    "UnknownSerdeError",
    "StoreClosedError",
    "SerializationError",
    "CorruptionError",
    "ChangelogError",
    "StoreLockedError",
    "ReadOnlyStoreError",
    "FencedError",
    "EngineError",
    "InvalidValueError",
]


class LocalStateError(Exception):
    """Base class of every error localstate raises on purpose."""


class ConfigError(LocalStateError, ValueError):
    """The configuration is invalid; the message names the key and the fix."""


class UnknownEngineError(ConfigError, LookupError):
    """No storage engine (or changelog system) is registered under the given name."""


class UnknownSystemError(ConfigError, LookupError):
    """No changelog system is registered under the requested name."""


class UnknownSerdeError(ConfigError, LookupError):
    """No serde is registered under the given name."""


class StoreClosedError(LocalStateError):
    """An operation was attempted on a closed store or a closed iterator."""


class SerializationError(LocalStateError, TypeError):
    """A key or value could not be encoded or decoded by the store's serde."""


class InvalidValueError(LocalStateError, ValueError):
    """A value the store cannot accept (e.g. ``put(key, None)``; use ``delete``)."""


class CorruptionError(LocalStateError):
    """Durable data failed validation; the message names the file and byte offset."""


class ChangelogError(LocalStateError):
    """The changelog could not be read or written (I/O, broker, permissions)."""


class StoreLockedError(LocalStateError):
    """Another process (or another open TaskStorage) holds the store or partition."""


class ReadOnlyStoreError(LocalStateError):
    """A write to a store opened read-only (state read from outside its job)."""


class FencedError(ChangelogError):
    """A newer instance of the same task took over; this zombie instance must stop."""


class EngineError(LocalStateError):
    """A storage engine failed (I/O, incompatible options, bad plug-in)."""
