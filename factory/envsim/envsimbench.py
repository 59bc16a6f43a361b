"""EnvSimBench compatibility: its lenient Config Match, its records and its SFT layout.

Why a module of its own: users compare simulators with EnvSimBench's published
numbers, so these functions follow EnvSimBench's public code
(``cookieApril/EnvSimBench``: ``Evaluation/10.SFT-evaluation.py`` for the metric,
``Construction/toolkit/13.transform-Alpace.py`` for the SFT layout) rather than
the factory's own, stricter, definitions in ``factory.envsim.simulator``.

* :func:`config_match` is EnvSimBench's Config Match as its evaluation code
  computes it: the predicted changes are applied to ``config_before`` (dotted
  paths, missing parents created, ``removed``/``delete`` deletes, any other type
  sets ``value``, else ``after``); then every change of
  ``diff_dicts(config_before, config_after)`` must find its ``after`` at its path
  in the result (walking dicts only; Python ``==``, so ``1 == 1.0 == True``).
  Consequences, each tested: a predicted ``null`` instead of a deletion passes
  (a removal's ``after`` is ``None``), overwriting a parent path with the right
  object passes, extra wrong changes elsewhere pass, and a correct deletion
  fails (the path is gone). A prediction in the factory's pointer format
  (``{"op", "path": "/a/b", "after"}``) is translated first (pointer to dotted
  path, ``remove`` to ``removed``).
* :func:`from_record` reads one EnvSimBench benchmark record (``task_info``,
  ``step_detail`` with ``action``, ``observation``, ``config_before``,
  ``config_after``, ``config_change.changes[]``; ``env_code``) as a step sample.
* :func:`to_sft_row` / :func:`from_sft_row` write and read EnvSimBench's alpaca
  SFT layout: instruction with the environment code, input
  ``{"initial_config": ..., "tool_call": "name({json})"}``, output
  ``{"feedback": ..., "config_changes": [{path, type, before, after}]}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from copy import deepcopy
from typing import Any

from factory.core.delta import diff
from factory.core.labels import step_labels
from factory.envsim.rows import SampleError, alpaca_prompt

__all__ = [
    "CODE_MARKER",
    "SFT_INSTRUCTION",
    "config_match",
    "diff_dicts",
    "from_record",
    "from_sft_row",
    "is_record",
    "pointer_ops",
    "read_sft_prompt",
    "to_sft_row",
    "tool_call_text",
]

#: The instruction of the SFT layout; ``{env_code}`` is the environment's code.
SFT_INSTRUCTION = (
    "You simulate the environment a tool runs in. From the environment code, the initial "
    "configuration and one tool call, give the environment's exact feedback and the "
    "configuration changes the call makes.\n\nEnvironment Code:\n{env_code}\n\n"
    "Run the tool call exactly as the code does and answer with the JSON result."
)
#: The line of :data:`SFT_INSTRUCTION` the environment code follows (how a server tells
#: a prompt of this layout).
CODE_MARKER = "Environment Code:"
_CALL = re.compile(r"\A\s*([^\s(]+)\((.*)\)\s*\Z", re.S)
_INPUT = re.compile(r'\{\s*"initial_config"\s*:')


def _sample_error(message: str) -> Exception:
    return SampleError(message)


# --- the metric ------------------------------------------------------------------------------


def diff_dicts(before: Any, after: Any, prefix: str = "") -> list[dict[str, Any]]:
    """EnvSimBench's change list: recursive over dicts, sorted keys, dotted paths.

    Anything that is not a dict on both sides is compared as a whole value
    (``modified``); a key only in ``after`` is ``added`` (``before`` None), a key
    only in ``before`` is ``removed`` (``after`` None).
    """
    before = before or {}
    after = after or {}
    keys: set[str] = set()
    if isinstance(before, dict):
        keys.update(before)
    if isinstance(after, dict):
        keys.update(after)
    changes: list[dict[str, Any]] = []
    for key in sorted(keys):
        path = f"{prefix}.{key}" if prefix else key
        b = before.get(key) if isinstance(before, dict) else None
        a = after.get(key) if isinstance(after, dict) else None
        if key not in before:
            changes.append({"path": path, "type": "added", "before": None, "after": a})
        elif key not in after:
            changes.append({"path": path, "type": "removed", "before": b, "after": None})
        elif isinstance(b, dict) and isinstance(a, dict):
            changes.extend(diff_dicts(b, a, prefix=path))
        elif b != a:
            changes.append({"path": path, "type": "modified", "before": b, "after": a})
    return changes


_KINDS = {"added": "add", "add": "add", "modified": "replace", "modify": "replace"}


def pointer_ops(changes: list[Any]) -> list[Any]:
    """EnvSimBench changes as the factory's pointer ops (for strict Config Match).

    ``added`` -> ``add``, ``modified`` -> ``replace``, ``removed``/``delete`` ->
    ``remove``; the value is ``value`` else ``after``. A change of another shape
    is passed on as it is (strict Config Match then counts it a miss).
    """
    ops: list[Any] = []
    for change in changes:
        path = change.get("path") if isinstance(change, Mapping) else None
        if not isinstance(path, str) or "op" in change:
            ops.append(change)
            continue
        pointer = "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path.split("."))
        kind = change.get("type")
        op: dict[str, Any] = {"path": pointer}
        if kind in ("removed", "delete", "remove"):
            op["op"] = "remove"
        else:
            op["op"] = _KINDS.get(kind, "replace")
            op["after"] = change["value"] if "value" in change else change.get("after")
        if "before" in change and op["op"] != "add":
            op["before"] = change["before"]
        ops.append(op)
    return ops


def _dotted(pointer: str) -> str:
    parts = pointer.split("/")[1:] if pointer.startswith("/") else [pointer]
    return ".".join(p.replace("~1", "/").replace("~0", "~") for p in parts)


def _their_change(op: Mapping[str, Any]) -> Mapping[str, Any]:
    """A factory pointer op as the change EnvSimBench's code would read (else ``op`` as is)."""
    if "type" in op or "op" not in op or not isinstance(op.get("path"), str):
        return op
    kind = "removed" if op["op"] == "remove" else "modified"
    return {"path": _dotted(op["path"]), "type": kind, "after": op.get("after")}


def _apply_change(obj: Any, path: Any, value: Any, change_type: Any) -> None:
    """EnvSimBench's ``apply_change``: set or delete at a dotted path, creating parents."""
    if not path:
        return
    if isinstance(path, list):
        parts = list(path)
    else:
        parts = path.split(".") if isinstance(path, str) else [str(path)]
    cur = obj
    for p in parts[:-1]:
        if isinstance(cur, dict):
            if p not in cur:
                cur[p] = {}
            cur = cur[p]
        elif isinstance(cur, list):
            idx = int(p)  # ValueError: their code gives up on this change
            while idx >= len(cur):
                cur.append({})
            cur = cur[idx]
        else:
            return
    last = parts[-1]
    if change_type in ("delete", "removed"):
        if isinstance(cur, dict):
            cur.pop(last, None)
        elif isinstance(cur, list):
            idx = int(last)
            if 0 <= idx < len(cur):
                cur.pop(idx)
    elif isinstance(cur, dict):
        cur[last] = value
    elif isinstance(cur, list):
        idx = int(last)
        while idx >= len(cur):
            cur.append(None)
        cur[idx] = value


def config_match(pred_changes: Any, config_before: Any, config_after: Any) -> bool:
    """EnvSimBench's (lenient) Config Match, as its evaluation code computes it.

    See the module docstring for the rule and its consequences. A change that is
    not an object, or a list index that is not a number, is a miss (EnvSimBench's
    script fails the sample with an exception).
    """
    predicted = deepcopy(config_before) if config_before is not None else {}
    changes = pred_changes if isinstance(pred_changes, list) else []
    try:
        for raw in changes:
            if not isinstance(raw, Mapping):
                return False
            change = _their_change(raw)
            value = change["value"] if "value" in change else change.get("after")
            _apply_change(predicted, change.get("path"), value, change.get("type"))
    except (ValueError, TypeError, IndexError, KeyError, AttributeError):
        return False
    for true in diff_dicts(config_before or {}, config_after or {}):
        cur = predicted
        for key in true["path"].split("."):
            if isinstance(cur, dict) and key in cur:
                cur = cur[key]
            else:
                return False
        if cur != true.get("after"):
            return False
    return True


# --- records and rows ------------------------------------------------------------------------


def tool_call_text(name: str, arguments: Any) -> str:
    """``name({json})``, the way EnvSimBench writes a tool call."""
    return f"{name}({json.dumps(arguments, ensure_ascii=False)})"


def _parse_call(text: str) -> tuple[str, dict[str, Any]]:
    found = _CALL.match(text)
    if found is None:
        raise _sample_error(f"tool_call {text[:60]!r} is not name({{json}})")
    try:
        arguments = json.loads(found[2]) if found[2].strip() else {}
    except ValueError as exc:
        raise _sample_error(f"tool_call arguments are not JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise _sample_error("tool_call arguments must be a JSON object")
    return found[1], arguments


def _read_input(body: Any) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """``(initial_config, tool, arguments)`` of an SFT row's input object."""
    if not isinstance(body, dict) or not isinstance(body.get("initial_config"), dict):
        raise _sample_error("input must hold initial_config (an object) and tool_call")
    if not isinstance(body.get("tool_call"), str):
        raise _sample_error("input.tool_call must be name({json})")
    name, arguments = _parse_call(body["tool_call"])
    return body["initial_config"], name, arguments


def read_sft_prompt(text: str) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """``(initial_config, tool, arguments)`` of a prompt in the SFT layout.

    The input is the JSON object that ends the prompt (the instruction, then the
    input, as LLaMA-Factory joins an alpaca row); what comes before it (the
    environment code) may hold anything.

    Raises:
        SampleError: no input object ends the prompt, or it is not of this layout.
    """
    end = len(text.rstrip())
    decoder = json.JSONDecoder()
    for found in _INPUT.finditer(text):
        try:
            body, stop = decoder.raw_decode(text, found.start())
        except ValueError:
            continue
        if stop == end:
            return _read_input(body)
    raise _sample_error("the prompt does not end with an input object holding initial_config")


def _observation_text(observation: Any) -> str:
    content = observation.get("content", "") if isinstance(observation, dict) else observation
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False)


def _labels(observation: str, delta: list[Any], arguments: dict[str, Any], **ids: Any) -> dict:
    """The factory's labels, with EnvSimBench's failure rule (``"success": false``) too."""
    labels = step_labels(observation, delta, arguments, **ids)
    try:
        parsed = json.loads(observation)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("success") is False:
        labels.update(outcome="failure", group="Failure")
    return labels


def is_record(record: Any) -> bool:
    """Whether ``record`` is an EnvSimBench benchmark record (has ``step_detail``)."""
    return isinstance(record, Mapping) and isinstance(record.get("step_detail"), Mapping)


def from_record(record: Mapping[str, Any], *, index: int | None = None) -> dict[str, Any]:
    """The step sample of one EnvSimBench benchmark record.

    ``state_before``/``state_after`` are ``config_before``/``config_after``; the
    Δ is the factory's diff of the two (pointer ops, for strict Config Match);
    the record's own ``config_change.changes`` are not needed, since EnvSimBench's
    metric recomputes them from the configs too. The prompt is the SFT layout's
    (:func:`to_sft_row`), so a model trained on that layout is asked what it
    learnt. ``task_info.task_id`` / ``env_id`` become provenance when present.

    Raises:
        SampleError: a field is missing or mistyped.
    """
    step = record.get("step_detail")
    if not isinstance(step, Mapping):
        raise _sample_error("an EnvSimBench record needs a step_detail object")
    action = step.get("action")
    name: Any
    arguments: Any
    if isinstance(action, str):
        name, arguments = _parse_call(action)
    elif isinstance(action, Mapping):
        name = action.get("name") or action.get("action")
        arguments = action.get("arguments", action.get("args", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                raise _sample_error(f"action arguments are not JSON: {exc}") from None
    else:
        raise _sample_error("step_detail.action must be an object or name({json})")
    if not isinstance(name, str) or not isinstance(arguments, dict):
        raise _sample_error("step_detail.action needs a name and an arguments object")
    before, after = step.get("config_before"), step.get("config_after")
    if not isinstance(before, dict) or not isinstance(after, dict):
        raise _sample_error("step_detail needs config_before and config_after objects")
    info = record.get("task_info") if isinstance(record.get("task_info"), Mapping) else {}
    assert isinstance(info, Mapping)
    observation = _observation_text(step.get("observation"))
    delta = diff(before, after)
    ids = {
        "task_id": info.get("task_id", record.get("task_id")),
        "user_id": None,
        "env_id": info.get("env_id", record.get("env_id")),
    }
    sample: dict[str, Any] = {
        "id": record.get("id", record.get("sample_id", f"envsimbench-{index}")),
        "env_id": ids["env_id"],
        "tool": name,
        "arguments": arguments,
        "state_before": before,
        "state_after": after,
        "observation": observation,
        "delta": delta,
        "labels": _labels(observation, delta, arguments, **ids),
    }
    env_code = record.get("env_code") or record.get("env") or ""
    sample["prompt"] = _sft_prompt(str(env_code), before, name, arguments)
    return sample


def _sft_input(before: Any, name: str, arguments: Any) -> str:
    body = {"initial_config": before, "tool_call": tool_call_text(name, arguments)}
    return json.dumps(body, ensure_ascii=False, indent=2)


def _sft_prompt(env_code: str, before: Any, name: str, arguments: Any) -> list[dict[str, str]]:
    row = {
        "instruction": SFT_INSTRUCTION.format(env_code=env_code),
        "input": _sft_input(before, name, arguments),
    }
    return alpaca_prompt(row)


def to_sft_row(
    sample: Mapping[str, Any], *, env_code: str, facts: str | None = None
) -> dict[str, str]:
    """One alpaca row in EnvSimBench's SFT layout.

    Args:
        sample: a step sample (``state_before``, ``state_after`` or ``delta``,
            ``tool``, ``arguments``, ``observation``).
        env_code: the environment code shown in the instruction.
        facts: the domain's facts no state shows (the current time, new ids),
            appended to the instruction so the output is derivable from the row.
    """
    from factory.core.delta import apply

    before = sample["state_before"]
    after = sample.get("state_after")
    if after is None:
        after = apply(sample["delta"], before)
    output = {"feedback": sample["observation"], "config_changes": diff_dicts(before, after)}
    instruction = SFT_INSTRUCTION.format(env_code=env_code)
    if facts:
        instruction += f"\n\nEnvironment facts:\n{facts.strip()}"
    return {
        "instruction": instruction,
        "input": _sft_input(before, sample["tool"], sample["arguments"]),
        "output": json.dumps(output, ensure_ascii=False, indent=2),
    }


def from_sft_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The step sample of an alpaca row in EnvSimBench's SFT layout (see :func:`to_sft_row`).

    The state after is ``config_changes`` applied to ``initial_config`` with
    EnvSimBench's own ``apply_change`` (the changes of ``diff_dicts`` rebuild
    the after state exactly).

    Raises:
        SampleError: the row is not in that layout.
    """
    try:
        body = json.loads(row["input"])
        answer = json.loads(row["output"])
    except ValueError as exc:
        raise _sample_error(f"input and output of an SFT row must be JSON: {exc}") from None
    before, name, arguments = _read_input(body)
    if not isinstance(answer, dict) or not isinstance(answer.get("config_changes"), list):
        raise _sample_error("output must hold feedback and config_changes (a list)")
    after = deepcopy(before)
    for change in answer["config_changes"]:
        if not isinstance(change, Mapping):
            raise _sample_error("every config change must be an object")
        _apply_change(after, change.get("path"), change.get("after"), change.get("type"))
    observation = _observation_text(answer.get("feedback", ""))
    delta = diff(before, after)
    meta = row.get("meta")
    meta = json.loads(meta) if isinstance(meta, str) else meta or {}
    labels = meta.get("labels") or _labels(observation, delta, arguments)
    return {
        "id": row.get("id"),
        "env_id": meta.get("env_id"),
        "tool": name,
        "arguments": arguments,
        "state_before": before,
        "state_after": after,
        "observation": observation,
        "delta": delta,
        "labels": labels,
        "prompt": alpaca_prompt(row),
    }
