"""Executable worlds and the domain plug-ins that supply them.

``get_environment(domain, db_dir=...)`` builds one; ``factory.envs.base`` has
the contract every world keeps, ``factory.envs.plugin`` what a domain plug-in
supplies, and ``factory.envs.registry`` how plug-ins are found (the
``factory.domains`` entry point group).
"""

from __future__ import annotations

from factory.envs.base import Environment, error_observation
from factory.envs.plugin import DataPack, DomainPlugin
from factory.envs.registry import (
    available_domains,
    get_environment,
    get_plugin,
    register_domain,
    register_environment,
)

__all__ = [
    "DataPack",
    "DomainPlugin",
    "Environment",
    "available_domains",
    "error_observation",
    "get_environment",
    "get_plugin",
    "register_domain",
    "register_environment",
]
