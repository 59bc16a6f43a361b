"""Scaffold a data-only domain pack from a user's seed trajectories (``factory.domain init``).

Why: a user who has seed trajectories of a domain nobody wrote a pack for should
not hand-write tools.json, a policy and a rules file before the first run. The
seeds already hold what the pack needs most: the tool specs (the ``tools``
column) and how the tools are called. This module turns parsed seed records into
the pack's files; what it guesses (each tool's ``x-kind``, from its name) is
marked for review in the file (``x-review``) and in the returned list, so the
user knows exactly what to read before a large run.

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

from factory.core.trajectory import normalize_tool_spec
from factory.errors import ConfigError

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


def _policy(name: str, tools: list[dict[str, Any]]) -> str:
    lines = [
        f"# {name}: agent policy (STUB, written by `factory.domain init`: review it)",
        "",
        "Replace this stub with the rules your agent follows. The amplification prompts show",
        "it to the model, and the LLM judge checks trajectories against it.",
        "",
        "## Tools",
        "",
    ]
    for tool in tools:
        desc = tool["description"].strip().splitlines()[0] if tool["description"] else ""
        lines.append(f"- `{tool['name']}` ({tool['x-kind']}): {desc or 'TODO: describe'}")
    lines += [
        "",
        "## Rules",
        "",
        "- TODO: what the agent must confirm with the user before a write tool runs.",
        "- TODO: what the agent must refuse.",
        "",
    ]
    return "\n".join(lines)


def _rules(name: str) -> str:
    return (
        f"# Argument rules of the {name} domain (STUB, written by `factory.domain init`).\n"
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


def _recipe(name: str, seeds_path: str, templates: str) -> str:
    return f"""# Amplification of the {name} seeds (written by `factory.domain init`; review it).
# Offline against the development server:
#   python -m factory.run pipelines/{name}.yaml --devserver --set amplify.target=50
name: {name}-amplify
pipeline: amplify
domain:
  name: {name}
  tools: ../prompts/{name}/tools.json
  policy: ../prompts/{name}/policy.md
  rules: ../filters/{name}.yaml
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
  dir: ../out/{name}
  dataset_name: factory_{name}
ray:
  actors: 2
  num_cpus: 0.25
"""


def scaffold(
    name: str, records: Iterable[Any], *, seeds_path: str, templates: str = "../prompts"
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
        The files (``prompts/NAME/tools.json``, ``prompts/NAME/policy.md``,
        ``filters/NAME.yaml``, ``pipelines/NAME.yaml``) and the review list.

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
    without_tools = 0
    for record in records:
        if not isinstance(record, Mapping):
            continue
        out.seeds += 1
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
    for tool_name in sorted(specs):
        tool = specs[tool_name]
        kind, why = guess_kind(tool_name)
        tool["x-kind"] = kind
        tool["x-review"] = f"x-kind {kind!r} guessed: {why}; check it, then delete this key"
        out.tools.append(tool)
        out.review.append(f"tool {tool_name}: x-kind {kind} guessed ({why})")
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
    out.review += [
        f"prompts/{name}/policy.md is a stub: write the agent's rules",
        f"filters/{name}.yaml has no rules: add argument formats (ids, emails, dates)",
        f"pipelines/{name}.yaml: the model, endpoints, target and max_cost_usd",
    ]
    out.files = {
        f"prompts/{name}/tools.json": json.dumps(out.tools, indent=2, ensure_ascii=False) + "\n",
        f"prompts/{name}/policy.md": _policy(name, out.tools),
        f"filters/{name}.yaml": _rules(name),
        f"pipelines/{name}.yaml": _recipe(name, seeds_path, templates),
    }
    return out
