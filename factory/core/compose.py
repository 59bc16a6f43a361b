"""Multi-app composition (OfficeBench style): rules as data, companions, and the validator.

Why: OfficeBench's 76 one-app tasks grew into 30k multi-app trajectories in Simia
(arXiv 2511.01824) by asking for tasks that pass information *between* apps: the
date read in an email becomes a calendar event, the total of a sheet goes into a
document. A composition recipe shows the model one-app seeds of several apps and
asks for such a task; this module holds the parts that are pure logic:

* :class:`CompositionRules`, read from the pack's ``compose.yaml`` (which apps, how
  many per task, which arguments the agent authors itself, what a valid file path is,
  how values flow between apps);
* :func:`companions`, the deterministic choice of the other apps' seeds shown beside a
  call's reference (a pure function of the call, so a resume makes the same prompts);
* :meth:`CompositionRules.check`, the validator: a composed trajectory uses at least
  ``min_apps`` apps, every value an action uses comes from the task or an earlier
  observation (authored arguments excepted), every file path is valid, and (with
  ``require_flow``) at least one value read in one app is used by another.

File format (``prompts/<domain>/compose.yaml``)::

    apps:                          # app -> what it holds (shown in the prompt)
      email: messages with sender, subject, date and body
      calendar: events with date, time and title
    min_apps: 2
    max_apps: 3
    authored: [email.send_email.body, answer.value]   # action.argument the agent writes
    paths:
      arguments: [path]            # argument names that hold file paths
      pattern: '^/home/office/[A-Za-z0-9_./-]+$'
      created_by: [docs.create_document]              # actions whose path may be new
    flows:                         # how a value moves between apps (shown in the prompt)
      - {from: email, to: calendar, what: a date read in an email becomes an event}
    require_flow: true
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.core.grammar import ActionGrammar
from factory.core.reasons import Issue
from factory.core.trajectory import Trajectory, canonical_json
from factory.core.yamlfile import known_keys as _known
from factory.core.yamlfile import mapping_items, read_yaml
from factory.errors import ConfigError, short

__all__ = ["COMPOSE_CODES", "CompositionRules", "apps_used", "companions"]

#: The reason codes of the validator, most fundamental first.
COMPOSE_CODES: tuple[str, ...] = ("too_few_apps", "invalid_path", "ungrounded_value", "no_app_flow")

_TOP_KEYS = ("apps", "min_apps", "max_apps", "authored", "paths", "flows", "require_flow")
_PATH_KEYS = ("arguments", "pattern", "created_by")
_FLOW_KEYS = ("from", "to", "what")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Flow:
    """How a value read in one app is used by another (prompt text and docs)."""

    source: str
    target: str
    what: str


@dataclass(frozen=True)
class CompositionRules:
    """The pack's composition rules (see the module docstring)."""

    apps: Mapping[str, str]
    min_apps: int = 2
    max_apps: int = 3
    authored: frozenset[str] = frozenset()
    path_arguments: frozenset[str] = frozenset()
    path_pattern: str | None = None
    created_by: frozenset[str] = frozenset()
    flows: tuple[Flow, ...] = ()
    require_flow: bool = True

    @classmethod
    def load(cls, path: str | Path, grammar: ActionGrammar) -> CompositionRules:
        """Read ``compose.yaml``, checked against the grammar it composes.

        Raises:
            ConfigError: naming the file and the key path inside it.
        """
        raw = read_yaml(path, "composition rules", key_path="domain.compose")
        try:
            return cls.from_dict(raw, grammar)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}", key_path="domain.compose") from exc

    @classmethod
    def from_dict(cls, raw: Any, grammar: ActionGrammar) -> CompositionRules:
        """Build the rules; every app, action and argument named must exist in ``grammar``.

        Raises:
            ConfigError: an unknown key, app, action or argument; a bad count or regex.
        """
        if not isinstance(raw, Mapping):
            raise ConfigError("composition rules must be a mapping with apps", key_path="")
        _known(raw, _TOP_KEYS, "")
        known_apps = {a.app for a in grammar.actions if a.app is not None}
        apps = raw.get("apps")
        if not isinstance(apps, Mapping) or len(apps) < 2:
            raise ConfigError("must map at least two apps to what they hold", key_path="apps")
        for app, about in apps.items():
            if app not in known_apps:
                raise ConfigError(
                    f"no action of grammar {grammar.name!r} belongs to app {app!r} "
                    f"(apps: {', '.join(sorted(known_apps))})",
                    key_path=f"apps.{app}",
                )
            if not isinstance(about, str):
                raise ConfigError("must be a string", key_path=f"apps.{app}")
        low, high = raw.get("min_apps", 2), raw.get("max_apps", 3)
        for key, value in (("min_apps", low), ("max_apps", high)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 2:
                raise ConfigError("must be an integer of at least 2", key_path=key)
        if high < low or low > len(apps):
            raise ConfigError(
                f"min_apps {low} must be at most max_apps {high} and the {len(apps)} apps",
                key_path="min_apps",
            )
        authored = frozenset(_dotted_arguments(raw.get("authored") or [], "authored", grammar))
        paths = raw.get("paths") or {}
        if not isinstance(paths, Mapping):
            raise ConfigError("must be a mapping", key_path="paths")
        _known(paths, _PATH_KEYS, "paths")
        path_arguments = paths.get("arguments") or []
        if not isinstance(path_arguments, list) or not all(
            isinstance(a, str) for a in path_arguments
        ):
            raise ConfigError("must be a list of argument names", key_path="paths.arguments")
        pattern = paths.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str):
                raise ConfigError("must be a regular expression", key_path="paths.pattern")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(
                    f"not a regular expression: {exc}", key_path="paths.pattern"
                ) from exc
        created_by = paths.get("created_by") or []
        if not isinstance(created_by, list):
            raise ConfigError("must be a list of action names", key_path="paths.created_by")
        for n, name in enumerate(created_by):
            if grammar.action(name) is None:
                raise ConfigError(f"no action named {name!r}", key_path=f"paths.created_by[{n}]")
        flows = []
        flow_items = mapping_items(
            raw.get("flows") or [], "flows", _FLOW_KEYS, "a mapping {from, to}"
        )
        for where, item in flow_items:
            for key in ("from", "to"):
                if item.get(key) not in apps:
                    raise ConfigError(
                        f"not an app of apps: {item.get(key)!r}", key_path=f"{where}.{key}"
                    )
            flows.append(Flow(item["from"], item["to"], str(item.get("what") or "")))
        require = raw.get("require_flow", True)
        if not isinstance(require, bool):
            raise ConfigError("must be true or false", key_path="require_flow")
        return cls(
            apps=dict(apps),
            min_apps=low,
            max_apps=high,
            authored=authored,
            path_arguments=frozenset(path_arguments),
            path_pattern=pattern,
            created_by=frozenset(created_by),
            flows=tuple(flows),
            require_flow=require,
        )

    def to_json(self) -> str:
        """The rules as JSON, for the static block of a composition prompt."""
        return canonical_json(
            {
                "apps": dict(self.apps),
                "min_apps": self.min_apps,
                "max_apps": self.max_apps,
                "authored": sorted(self.authored),
                "paths": {
                    "arguments": sorted(self.path_arguments),
                    "pattern": self.path_pattern,
                    "created_by": sorted(self.created_by),
                },
                "flows": [{"from": f.source, "to": f.target, "what": f.what} for f in self.flows],
                "require_flow": self.require_flow,
            }
        )

    # --- the validator --------------------------------------------------------------------
    def check(self, traj: Trajectory, grammar: ActionGrammar) -> list[Issue]:
        """Composition issues of a (parsed, action-valid) text-action trajectory.

        Returns:
            ``too_few_apps``, ``invalid_path``, ``ungrounded_value`` (turn and argument
            path set) and ``no_app_flow``, in that order.
        """
        issues: list[Issue] = []
        used = apps_used(traj, grammar)
        if len(used) < self.min_apps:
            issues.append(
                Issue(
                    "too_few_apps",
                    f"uses {len(used)} app(s) ({', '.join(used) or 'none'}); a composed task "
                    f"needs at least {self.min_apps}",
                )
            )
        task = _norm(" ".join(t.content for t in traj.turns if t.role == "user"))
        seen: list[tuple[str | None, str]] = []  # (app, normalised observation) so far
        flowed = False
        current: tuple[int, str | None] | None = None
        for i, turn in enumerate(traj.turns):
            if turn.role == "tool":
                app = current[1] if current is not None else None
                seen.append((app, _norm(turn.content)))
                continue
            if turn.role != "assistant" or not turn.tool_calls:
                continue
            call = turn.tool_calls[0]
            app = grammar.app_of(call.name)
            current = (i, app)
            for arg, value in call.arguments.items():
                path_arg = arg in self.path_arguments
                if path_arg and self.path_pattern is not None:
                    bad = [v for v in _leaves(value) if not re.search(self.path_pattern, v)]
                    if bad:
                        issues.append(
                            Issue(
                                "invalid_path",
                                f"{call.name}.{arg}: {short(bad[0], 80)!r} is not a valid path",
                                turn=i,
                                path=arg,
                            )
                        )
                if f"{call.name}.{arg}" in self.authored or (
                    path_arg and call.name in self.created_by
                ):
                    continue
                for leaf in _leaves(value):
                    wanted = _norm(leaf)
                    if not wanted:
                        continue
                    if wanted in task:
                        continue
                    sources = [src for src, text in seen if wanted in text]
                    if not sources:
                        issues.append(
                            Issue(
                                "ungrounded_value",
                                f"{call.name}.{arg}: {short(leaf, 60)!r} appears neither in the "
                                "task nor in an earlier observation",
                                turn=i,
                                path=arg,
                            )
                        )
                    elif app is not None and any(s is not None and s != app for s in sources):
                        flowed = True
        if self.require_flow and len(used) >= self.min_apps and not flowed:
            issues.append(
                Issue(
                    "no_app_flow",
                    "no action uses a value first read in another app's observation "
                    "(the apps do not pass information)",
                )
            )
        order = {code: n for n, code in enumerate(COMPOSE_CODES)}
        return sorted(issues, key=lambda x: order[x.code])


def apps_used(traj: Trajectory, grammar: ActionGrammar) -> list[str]:
    """The apps a trajectory's actions belong to, in order of first use."""
    apps: dict[str, None] = {}
    for _, call in traj.calls():
        app = grammar.app_of(call.name)
        if app is not None:
            apps.setdefault(app, None)
    return list(apps)


def companions(
    primary: str,
    seed_apps: Mapping[str, Sequence[str]],
    rules: CompositionRules,
    call_index: int,
    seed: int,
) -> list[str]:
    """The seeds shown beside ``primary`` in composition call ``call_index``.

    Each companion comes from an app neither ``primary`` nor an earlier companion
    uses; how many (``min_apps - 1`` to ``max_apps - 1``, as far as apps allow) and
    which are drawn from ``(seed, call_index)`` alone, so a rerun or a resume shows
    the same companions.

    Args:
        primary: the call's reference seed id.
        seed_apps: every kept seed id -> the apps its actions use.
        rules: the composition rules (which apps count).
        call_index: the global call index.
        seed: the recipe's ``amplify.seed``.

    Returns:
        Companion seed ids, possibly fewer than ``min_apps - 1`` when no seed of
        another app exists (the validator then rejects what comes back).
    """
    rng = random.Random(f"compose:{seed}:{call_index}")
    taken = set(seed_apps.get(primary, ())) & set(rules.apps)
    by_app: dict[str, list[str]] = {}
    for sid in sorted(seed_apps):
        apps = [a for a in seed_apps[sid] if a in rules.apps]
        if len(apps) == 1 and sid != primary:
            by_app.setdefault(apps[0], []).append(sid)
    free = sorted(a for a in by_app if a not in taken)
    rng.shuffle(free)
    want = rng.randint(rules.min_apps, rules.max_apps) - max(1, len(taken))
    return [rng.choice(by_app[app]) for app in free[: max(0, want)]]


def _leaves(value: Any) -> Iterator[str]:
    """The scalar values inside an argument (lists and objects walked), as text."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, (int, float)):
        yield format(value, "f").rstrip("0").rstrip(".") if isinstance(value, float) else str(value)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)


def _norm(text: str) -> str:
    return _SPACE.sub(" ", text).strip().lower()


def _dotted_arguments(raw: Any, at: str, grammar: ActionGrammar) -> list[str]:
    if not isinstance(raw, list):
        raise ConfigError("must be a list of action.argument names", key_path=at)
    for n, item in enumerate(raw):
        name, _, arg = str(item).rpartition(".")
        action = grammar.action(name)
        if action is None or arg not in {a.name for a in action.arguments}:
            raise ConfigError(
                f"{short(item, 60)!r} names no argument of an action of the grammar",
                key_path=f"{at}[{n}]",
            )
    return [str(x) for x in raw]
