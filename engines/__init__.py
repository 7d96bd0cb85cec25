"""Built-in storage engines and the engine registry's public view.

Engines are imported lazily by name (``localstate.registry``); importing this
package imports none of their heavy dependencies.
"""

from __future__ import annotations

from localstate.registry import available, register_engine

__all__ = ["available", "register_engine"]
