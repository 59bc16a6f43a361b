"""Executable worlds: domains whose tool calls can be run instead of simulated.

``get_environment("airline", db_dir=...)`` builds one; see ``factory.envs.base``
for the contract every domain keeps.
"""

from __future__ import annotations

from factory.envs.base import (
    BUILTIN,
    Environment,
    available_domains,
    error_observation,
    get_environment,
    register_environment,
)

__all__ = [
    "BUILTIN",
    "Environment",
    "available_domains",
    "error_observation",
    "get_environment",
    "register_environment",
]
