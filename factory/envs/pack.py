"""A domain pack: the tools, the policy and the validation rules of one domain.

Why a pack and not code: a new domain should need data files (a tool list, a
policy, ``filters/<domain>.yaml``), not a Python module. A recipe names the
files; a recipe that names none uses the pack its domain's plug-in ships
(``factory.envs.plugin.DataPack``). The executable world of a domain is an
optional part of the plug-in.

A text-action domain (AgentBench style: the action is text in the agent's turn)
names an action grammar (``domain.grammar``, ``factory.core.grammar``) instead of
tools, and may name multi-app composition rules (``domain.compose``,
``factory.core.compose``); it has no tools and needs no plug-in.

The loader reads the recipe's ``domain`` section only, whose paths the recipe
resolved when it was loaded (``factory.recipe.paths``): it never calls back into the
recipe. A pack is read once per process while its files are unchanged (``load_domain``
keeps it by the section and the files' sizes and times): the driver loads it once per
run and hands the ``Domain`` to the stages it declares.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factory.core.trajectory import normalize_tool_spec
from factory.errors import ConfigError

if TYPE_CHECKING:
    from factory.core.compose import CompositionRules
    from factory.core.grammar import ActionGrammar
    from factory.core.rules import DomainRules
    from factory.envs.plugin import DataPack
    from factory.recipe import DomainConfig

__all__ = [
    "KINDS",
    "REVIEW_MARKER",
    "Domain",
    "check_reviewed",
    "domain_from_pack",
    "load_domain",
    "unreviewed",
]

KINDS = ("read", "write", "generic")
#: What ``factory domain init`` writes where a person must review a guess or a stub: an
#: ``x-review`` key in tools.json, an ``x-review:`` comment in the policy, rules and recipe.
#: A run refuses to start while a file of its pack (or the recipe) still holds it.
REVIEW_MARKER = "x-review"


@dataclass
class Domain:
    """Tools (bare specs, with ``x-kind``), policy text and rules of a domain; a
    text-action domain has a ``grammar`` (and maybe ``compose`` rules) and no tools."""

    name: str
    tools: list[dict[str, Any]]
    policy: str = ""
    rules: DomainRules | None = None
    kinds: dict[str, str] = field(default_factory=dict)
    grammar: ActionGrammar | None = None
    compose: CompositionRules | None = None

    def public_tools(self) -> list[dict[str, Any]]:
        """Tool specs as models and trainers see them: without ``x-`` keys."""
        return [{k: v for k, v in t.items() if not k.startswith("x-")} for t in self.tools]

    def write_tools(self) -> set[str]:
        return {name for name, kind in self.kinds.items() if kind == "write"}


def _load_tools(path: Path, key_path: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"cannot read tools file {path}: {exc.strerror}", key_path=key_path
        ) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"tools file {path} is not JSON text: {exc}", key_path=key_path) from exc
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"tools file {path} must hold a non-empty list", key_path=key_path)
    tools, kinds = [], {}
    for i, spec in enumerate(raw):
        try:
            tool = normalize_tool_spec(spec)
        except ValueError as exc:
            raise ConfigError(f"tool #{i} in {path}: {exc}", key_path=key_path) from exc
        kind = tool.get("x-kind", "generic")
        if kind not in KINDS:
            raise ConfigError(
                f"tool {tool['name']!r}: x-kind must be one of {KINDS}, got {kind!r}",
                key_path=key_path,
            )
        tools.append(tool)
        kinds[tool["name"]] = kind
    return tools, kinds


#: Domains loaded in this process, by their section and their files' (size, mtime).
_LOADED: dict[tuple[str, tuple[tuple[int, int] | None, ...]], Domain] = {}


def load_domain(domain: DomainConfig) -> Domain:
    """Load the pack a recipe's ``domain`` section points at (its paths resolved).

    The same section over unchanged files gives the same ``Domain`` object without
    reading them again (the driver asks in several places during a run); treat it
    as read-only.

    Raises:
        ConfigError: a file is missing or malformed (the key path names the recipe field).
    """
    key = (domain.model_dump_json(), tuple(_stat(p) for p in _section_files(domain)))
    loaded = _LOADED.get(key)
    if loaded is None:
        loaded = _text_action_domain(domain) if domain.grammar is not None else _tool_domain(domain)
        if len(_LOADED) > 64:
            _LOADED.clear()
        _LOADED[key] = loaded
    return loaded


def _section_files(domain: DomainConfig) -> list[str]:
    return [
        f for f in (domain.tools, domain.policy, domain.rules, domain.grammar, domain.compose) if f
    ]


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def _tool_domain(d: DomainConfig) -> Domain:
    """A domain whose actions are tool calls: the section's files or its plug-in's pack."""
    tools_path, policy_path, rules_path = _pack_paths(d)
    tools, kinds = _load_tools(tools_path, "domain.tools")
    policy = _read_policy(policy_path)
    rules = _read_rules(rules_path)
    return Domain(name=d.name, tools=tools, policy=policy, rules=rules, kinds=kinds)


def _text_action_domain(d: DomainConfig) -> Domain:
    """A domain whose actions are text: grammar, policy, rules and composition rules."""
    from factory.core.compose import CompositionRules
    from factory.core.grammar import ActionGrammar

    assert d.grammar is not None  # the caller's branch
    grammar = ActionGrammar.load(Path(d.grammar))
    compose = CompositionRules.load(Path(d.compose), grammar) if d.compose else None
    return Domain(
        name=d.name,
        tools=[],
        policy=_read_policy(Path(d.policy) if d.policy else None),
        rules=_read_rules(Path(d.rules) if d.rules else None),
        grammar=grammar,
        compose=compose,
    )


def _read_policy(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read policy: {exc}", key_path="domain.policy") from exc


def _read_rules(rules_path: Path | None) -> DomainRules | None:
    from factory.core.rules import DomainRules  # local: rules imports jsonschema validators

    rules = None
    if rules_path is not None:
        if not rules_path.is_file():
            raise ConfigError(f"rules file {rules_path} not found", key_path="domain.rules")
        try:
            rules = DomainRules.load(rules_path)
        except ConfigError as exc:  # name the recipe field, then where in the file
            where = f" ({exc.key_path})" if exc.key_path else ""
            raise ConfigError(f"{rules_path}{where}: {exc}", key_path="domain.rules") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{rules_path} is not text: {exc}", key_path="domain.rules") from exc
    return rules


def _pack_paths(d: DomainConfig) -> tuple[Path, Path | None, Path | None]:
    """The section's files, or (when it names no tools) its domain plug-in's pack."""
    if d.tools is not None:
        return (
            Path(d.tools),
            Path(d.policy) if d.policy else None,
            Path(d.rules) if d.rules else None,
        )
    from factory.envs.registry import get_plugin

    try:
        pack = get_plugin(d.name, needs="pack").pack
    except ConfigError as exc:
        raise ConfigError(
            f"{exc}; or name the domain's files (domain.tools, domain.policy, domain.rules)",
            key_path="domain.tools",
        ) from exc
    assert pack is not None
    return (
        pack.tools,
        Path(d.policy) if d.policy else pack.policy,
        Path(d.rules) if d.rules else pack.rules,
    )


def domain_from_pack(name: str, pack: DataPack) -> Domain:
    """The ``Domain`` of a plug-in's shipped pack (no recipe: ``factory.simenv``).

    Raises:
        ConfigError: a file is missing or malformed.
    """
    from factory.core.rules import DomainRules

    tools, kinds = _load_tools(pack.tools, "domain.tools")
    policy = pack.policy.read_text(encoding="utf-8") if pack.policy is not None else ""
    rules = DomainRules.load(pack.rules) if pack.rules is not None else None
    return Domain(name=name, tools=tools, policy=policy, rules=rules, kinds=kinds)


def unreviewed(domains: list[DomainConfig], recipe_file: Path | None = None) -> list[Path]:
    """The files of these packs, and the recipe file, that still hold the
    :data:`REVIEW_MARKER` of a scaffold (a mixed recipe: each part's pack)."""
    files: list[Path] = [recipe_file] if recipe_file is not None else []
    for domain in domains:
        try:
            files += [f for f in _pack_paths(domain) if f is not None]
        except ConfigError:
            continue  # an unknown domain: load_domain names it when the run needs it
    marked = []
    for file in dict.fromkeys(files):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # load_domain reports an unreadable file
        if REVIEW_MARKER in text:
            marked.append(file)
    return marked


def check_reviewed(domains: list[DomainConfig], recipe_file: Path | None = None) -> None:
    """Refuse a recipe whose pack a person has not reviewed yet.

    Raises:
        ConfigError: a file still holds :data:`REVIEW_MARKER` (every such file named).
    """
    marked = unreviewed(domains, recipe_file)
    if marked:
        names = ", ".join(str(f) for f in marked)
        raise ConfigError(
            f"not reviewed yet: {names} still hold{'s' if len(marked) == 1 else ''} the "
            f"'{REVIEW_MARKER}' marks `factory domain init` left on guesses and stubs; read "
            "each one, fix what is wrong and delete the mark (or run with --allow-unreviewed "
            "to use the pack as it is)",
            key_path="domain",
        )
