"""factory: a Ray-distributed synthetic data factory for tool-using LLM agents.

A seed trajectory flows: ``readers`` (bytes -> raw records) -> ``formats``
(raw record -> canonical ``Trajectory``, with ``repair``) -> ``validate``
(reason-coded issues) -> ``export`` (LLaMA-Factory views) -> ``writer``
(Parquet shards, rejects, manifest). ``run`` is the CLI over all of it.
"""

from __future__ import annotations

from factory.errors import (
    BudgetExceeded,
    ConfigError,
    FactoryError,
    LLMError,
    RepairError,
    SeedError,
    SeedFormatError,
    ValidationError,
)
from factory.reasons import REASONS, Issue
from factory.trajectory import ToolCall, Trajectory, Turn

__version__ = "0.1.0"

__all__ = [
    "REASONS",
    "BudgetExceeded",
    "ConfigError",
    "FactoryError",
    "Issue",
    "LLMError",
    "RepairError",
    "SeedError",
    "SeedFormatError",
    "ToolCall",
    "Trajectory",
    "Turn",
    "ValidationError",
    "__version__",
]
