"""Stateful PySpark jobs on localstate: partition = task."""
