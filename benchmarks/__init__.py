"""The benchmark suite (``localstate bench``)."""
