"""One stage per module: a pure function over a batch behind the thin Ray adapter of ``base``."""
