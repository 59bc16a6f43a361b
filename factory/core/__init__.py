"""Core: the trajectory model and the pure logic over it.

Formats, lossless repair, validation and domain rules, the LLaMA-Factory export,
state deltas, labels, mixtures. Plain functions over rows, testable without Ray:
nothing here imports Ray, the engine, the I/O layer or the LLM clients (the
import-linter contracts in ``pyproject.toml`` hold that; see ARCHITECTURE.md).
"""
