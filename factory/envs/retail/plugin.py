"""The retail domain as a plug-in: what the engine may ask of it, in one place.

Registered through the ``factory.domains`` entry point group in
``pyproject.toml`` (``retail = "factory.envs.retail.plugin:plugin"``), the
same hook the airline and any third-party domain use; importing this module
registers nothing. Heavy parts import lazily so loading the plug-in stays cheap.

The data pack (``prompts/retail/``, ``filters/retail.yaml``) and the
development server's hooks (``factory.envs.retail.devserver``) are set only
when they exist in the tree, so the plug-in works before and after they land.
"""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from factory.envs.base import Environment
from factory.envs.plugin import DataPack, DomainPlugin

__all__ = ["NAME", "plugin"]

NAME = "retail"
#: The shipped pack: ``prompts/retail/`` and ``filters/retail.yaml`` beside the package.
_ROOT = Path(__file__).resolve().parents[3]


def _environment(**kw: Any) -> Environment:
    from factory.envs.retail import RetailEnv

    return RetailEnv.create(**kw)


def _tool_functions() -> Mapping[str, Callable[..., Any]]:
    from factory.envs.retail.tools import TOOLS

    return TOOLS


def _pack() -> DataPack | None:
    tools = _ROOT / "prompts" / NAME / "tools.json"
    if not tools.is_file():
        return None
    policy = _ROOT / "prompts" / NAME / "policy.md"
    rules = _ROOT / "filters" / f"{NAME}.yaml"
    return DataPack(
        tools=tools,
        policy=policy if policy.is_file() else None,
        rules=rules if rules.is_file() else None,
    )


def _has_devserver() -> bool:
    return importlib.util.find_spec("factory.envs.retail.devserver") is not None


def plugin() -> DomainPlugin:
    """The retail plug-in (the entry point's target)."""
    from factory.envs.retail.world import generate_world

    return DomainPlugin(
        name=NAME,
        pack=_pack(),
        environment=_environment,
        world_sizes=frozenset(inspect.signature(generate_world).parameters) - {"seed"},
        tool_functions=_tool_functions,
    )
