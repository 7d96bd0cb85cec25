"""Integrations and examples built only on the public API (Spark runner, example engines)."""
