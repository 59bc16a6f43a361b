"""What the simulator's row readers share: their error and the alpaca prompt.

Why a module of its own: ``factory.envsim.simulator`` (the factory's layout) and
``factory.envsim.envsimbench`` (EnvSimBench's) both read alpaca rows back into
step samples; the one error and the one prompt rule live below both, so neither
imports the other's internals.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from factory.errors import FactoryError

__all__ = ["SampleError", "alpaca_prompt"]


class SampleError(FactoryError):
    """A record is not a usable step sample (a missing, mistyped or inconsistent field)."""

    reason = "bad_step_sample"


def alpaca_prompt(record: Mapping[str, Any]) -> list[dict[str, str]]:
    """The chat messages LLaMA-Factory builds from an alpaca row (user: instruction + input)."""
    query = [record["instruction"]] + ([record["input"]] if record.get("input") else [])
    messages = [{"role": "user", "content": "\n".join(query)}]
    if record.get("system"):
        messages.insert(0, {"role": "system", "content": str(record["system"])})
    return messages
