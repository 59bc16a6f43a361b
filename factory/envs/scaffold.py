"""Scaffold a data-only domain pack from a user's seed trajectories (``factory.domain init``).

Why: a user who has seed trajectories of a domain nobody wrote a pack for should
not hand-write tools.json, a policy and a rules file before the first run. The
seeds already hold what the pack needs most: the tool specs (the ``tools``
column), how the tools behave (``factory.envs.kinds``: a call that returns a new id
or a changed record is a write) and the agent's system prompt. This module turns seed
records into the pack's files. Everything it guessed or stubbed carries the review
mark ``x-review`` (``factory.envs.pack.REVIEW_MARKER``: a key in tools.json, a comment
in the other files) and is listed in the returned review list; a run refuses the pack
until a person has deleted every mark (``factory run --allow-unreviewed`` overrides).

What the scaffold keeps from the seeds: the seeds' own system prompt becomes the policy
(the system prompt of every training row), never a stub; seeds without one give a pack
without a policy, and each row keeps its seed's (none). The recipe's paths follow the
README: the seed file and the pack relative to the recipe's folder, the factory's
templates as ``factory:prompts/...`` and the output folder relative to where the run
starts (``out/NAME``).

Pure: it takes records (dicts) and returns file texts; the command
(``factory/domain/__main__.py``) reads the seed file and writes the files.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from factory.core.formats import parse_record
from factory.core.trajectory import Trajectory, normalize_tool_spec
from factory.envs.kinds import observed_kinds
from factory.envs.pack import REVIEW_MARKER
from factory.errors import ConfigError, FactoryError

__all__ = ["Scaffold", "guess_kind", "scaffold"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# Verbs a tool name starts with (or holds as a word), by the kind they suggest.
READ_VERBS = frozenset(
    [
        "get",
        "list",
        "search",
        "find",
        "read",
        "lookup",
        "look",
        "check",
        "view",
        "show",
        "query",
        "fetch",
        "retrieve",
        "count",
        "describe",
        "download",
        "export",
        "preview",
        "inspect",
        "browse",
        "open",
    ]
)
WRITE_VERBS = frozenset(
    [
        "create",
        "add",
        "book",
        "send",
        "update",
        "delete",
        "remove",
        "cancel",
        "modify",
        "move",
        "rename",
        "schedule",
        "set",
        "upload",
        "write",
        "reply",
        "forward",
        "share",
        "invite",
        "accept",
        "decline",
        "archive",
        "mark",
        "post",
        "edit",
        "insert",
        "put",
        "patch",
        "reschedule",
        "assign",
        "unassign",
        "revoke",
        "grant",
        "change",
        "copy",
        "restore",
        "submit",
        "reset",
    ]
)


def guess_kind(name: str) -> tuple[str, str]:
    """``(x-kind, why)`` guessed from a tool's name: the first word that is a known verb.

    ``read`` for verbs that only look (get, list, search ...), ``write`` for verbs
    that change something (create, send, delete ...), else ``generic``.
    """
    words = [w for w in re.split(r"[_\W]+|(?<=[a-z])(?=[A-Z])", name) if w]
    for word in (w.lower() for w in words):
        if word in WRITE_VERBS:
            return "write", f"the name has the verb {word!r}"
        if word in READ_VERBS:
            return "read", f"the name has the verb {word!r}"
    return "generic", "no known verb in the name"


@dataclass
class Scaffold:
    """The pack's files (path relative to the root -> text) and what to review."""

    files: dict[str, str] = field(default_factory=dict)
    review: list[str] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    seeds: int = 0


def _tools_of(record: Mapping[str, Any]) -> list[Any]:
    tools = record.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            return []
    return tools if isinstance(tools, list) else []


def _called(record: Mapping[str, Any]) -> Iterable[str]:
    """Tool names the record's turns call (sharegpt ``function_call`` or OpenAI tool_calls)."""
    for turn in record.get("conversations") or record.get("messages") or []:
        if not isinstance(turn, Mapping):
            continue
        if turn.get("from") == "function_call":
            try:
                call = json.loads(turn.get("value") or "")
            except ValueError:
                continue
            calls = call if isinstance(call, list) else [call]
            for c in calls:
                if isinstance(c, Mapping) and isinstance(c.get("name"), str):
                    yield c["name"]
        for c in turn.get("tool_calls") or []:
            fn = c.get("function", c) if isinstance(c, Mapping) else {}
            if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
                yield fn["name"]


def _policy(name: str, system: str, others: int) -> str:
    """The policy: the seeds' own system prompt, under a review mark."""
    also = f" ({others} seed(s) have another one)" if others else ""
    return (
        f"<!-- {REVIEW_MARKER}: the system prompt of the {name} seeds{also}, written by "
        "`factory domain init` as the policy every training row gets; check it states the "
        "rules the agent must follow, then delete this line -->\n" + system.strip() + "\n"
    )


def _rules(name: str) -> str:
    return (
        f"# {REVIEW_MARKER}: a stub with no rules, written by `factory domain init`; add the\n"
        "# argument formats (ids, emails, dates) a call must keep, then delete this line.\n"
        f"# Argument rules of the {name} domain.\n"
        "# Each rule's `schema` is a JSON-Schema fragment applied to the value at `argument`\n"
        "# (dotted path; `[]` walks list items) of the listed tools. Example:\n"
        "#  - id: email_format\n"
        "#    description: Addresses look like name@host.\n"
        "#    tools: [send_email]\n"
        "#    argument: to\n"
        '#    schema: {type: string, pattern: "^[^@ ]+@[^@ ]+$"}\n'
        f"domain: {name}\n"
        "limits: {}\n"
        "rules: []\n"
    )


def _recipe(name: str, seeds_path: str, templates: str, policy: bool) -> str:
    policy_line = f"  policy: ../prompts/{name}/policy.md\n" if policy else ""
    return f"""# {REVIEW_MARKER}: written by `factory domain init`; set the model, endpoints, target
# and max_cost_usd, then delete this line (a run refuses the recipe until then).
# Amplification of the {name} seeds. Paths: the pack and the seeds relative to this file,
# the factory's templates as factory:prompts/..., the output relative to where you run.
# Offline against the development server:
#   python -m factory.run pipelines/{name}.yaml --devserver --set amplify.target=50
name: {name}-amplify
pipeline: amplify
domain:
  name: {name}
  tools: ../prompts/{name}/tools.json
{policy_line}  rules: ../filters/{name}.yaml
seeds:
  path: {json.dumps(seeds_path)}
  tools_from_domain: true
llm:
  model: gpt-5
  endpoints:
    - base_url: https://api.openai.com/v1
      api_key_env: OPENAI_API_KEY
  sampling:
    max_completion_tokens: 16000
  concurrency: 32
  timeout_s: 600
prefilter:
  enabled: true
  model: o4-mini
  prompt: {json.dumps(templates + "/prefilter.j2")}
amplify:
  target: 1000
  seed: 0
  prompt: {json.dumps(templates + "/amplify.j2")}
  max_cost_usd: 50
output:
  dir: out/{name}
  dataset_name: factory_{name}
ray:
  actors: 2
  num_cpus: 0.25
"""


def _trajectories(records: list[Mapping[str, Any]]) -> list[Trajectory]:
    """The records that parse as seeds (for what their calls show); the others are skipped."""
    out = []
    for i, record in enumerate(records):
        try:
            out.append(parse_record(dict(record), source=f"seed:{i}"))
        except FactoryError:
            continue
    return out


def scaffold(
    name: str, records: Iterable[Any], *, seeds_path: str, templates: str = "factory:prompts"
) -> Scaffold:
    """The files of a data-only pack for domain ``name`` from parsed seed records.

    Args:
        name: the domain's name (lower case, digits, underscores).
        records: seed records (dicts with a ``tools`` column: a list of function
            specs or its JSON text); others are counted, not used.
        seeds_path: the seed file as the recipe should name it (relative to
            ``pipelines/``).
        templates: the folder of the factory's prompt templates (``amplify.j2``,
            ``prefilter.j2``) as the recipe should name it.

    Returns:
        The files (``prompts/NAME/tools.json``, ``prompts/NAME/policy.md`` when the seeds
        have a system prompt, ``filters/NAME.yaml``, ``pipelines/NAME.yaml``) and the
        review list.

    Raises:
        ConfigError: a bad name, or no record has a usable tools column.
    """
    if not _NAME.match(name):
        raise ConfigError(
            "a domain name is lower case letters, digits and underscores", key_path="NAME"
        )
    out = Scaffold()
    specs: dict[str, dict[str, Any]] = {}
    variants: Counter[str] = Counter()
    called: Counter[str] = Counter()
    systems: Counter[str] = Counter()
    used: list[Mapping[str, Any]] = []
    without_tools = 0
    for record in records:
        if not isinstance(record, Mapping):
            continue
        out.seeds += 1
        used.append(record)
        raw = _tools_of(record)
        if not raw:
            without_tools += 1
        for spec in raw:
            try:
                tool = normalize_tool_spec(spec)
            except ValueError:
                continue
            tool = {k: v for k, v in tool.items() if not k.startswith("x-")}
            if tool["name"] not in specs:
                specs[tool["name"]] = tool
            elif json.dumps(specs[tool["name"]], sort_keys=True) != json.dumps(
                tool, sort_keys=True
            ):
                variants[tool["name"]] += 1
        called.update(_called(record))
    if not specs:
        raise ConfigError(
            f"no seed record has a tools column with function specs ({out.seeds} records read)",
            key_path="--from-seeds",
        )
    trajectories = _trajectories(used)
    systems.update(t.system.strip() for t in trajectories if t.system.strip())
    evidence = observed_kinds(trajectories)
    for tool_name in sorted(specs):
        tool = specs[tool_name]
        seen = evidence[tool_name].verdict() if tool_name in evidence else None
        if seen is not None:
            kind, why = seen[0], f"the seeds' calls show it: {seen[1]}"
        else:
            kind, named = guess_kind(tool_name)
            why = f"no seed call shows what it does; guessed from its name ({named})"
        tool["x-kind"] = kind
        tool["x-review"] = f"x-kind {kind!r}: {why}; check it, then delete this key"
        out.tools.append(tool)
        out.review.append(f"tool {tool_name}: x-kind {kind} ({why})")
        if not tool["description"]:
            out.review.append(f"tool {tool_name}: no description in the seeds; write one")
        if not tool["parameters"].get("properties"):
            out.review.append(f"tool {tool_name}: no parameters in the seeds; check its schema")
        if variants[tool_name]:
            out.review.append(
                f"tool {tool_name}: the seeds hold {variants[tool_name] + 1} different specs; "
                "the first one was kept"
            )
        if not called[tool_name]:
            out.review.append(f"tool {tool_name}: no seed calls it (amplification cannot learn it)")
    for tool_name in sorted(set(called) - set(specs)):
        out.review.append(f"tool {tool_name}: called in the seeds but in no tools column")
    if without_tools:
        out.review.append(f"{without_tools} seed records have no tools column")
    out.files[f"prompts/{name}/tools.json"] = (
        json.dumps(out.tools, indent=2, ensure_ascii=False) + "\n"
    )
    if systems:
        (system, _), *others = systems.most_common()
        out.files[f"prompts/{name}/policy.md"] = _policy(name, system, sum(n for _, n in others))
        out.review.append(
            f"prompts/{name}/policy.md is the seeds' own system prompt, the system prompt of "
            "every training row: check it states the agent's rules"
        )
    else:
        out.review.append(
            "the seeds have no system prompt, so the pack has no policy: the rows get none "
            f"(write prompts/{name}/policy.md and name it in the recipe to give them one)"
        )
    out.files[f"filters/{name}.yaml"] = _rules(name)
    out.files[f"pipelines/{name}.yaml"] = _recipe(name, seeds_path, templates, bool(systems))
    out.review += [
        f"filters/{name}.yaml has no rules: add argument formats (ids, emails, dates)",
        f"pipelines/{name}.yaml: the model, endpoints, target and max_cost_usd",
        f"then delete every '{REVIEW_MARKER}' mark: a run refuses the pack until they are gone",
    ]
    return out
