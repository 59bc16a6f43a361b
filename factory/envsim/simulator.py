"""The environment simulator's training format and its metrics (EnvSimBench, gaps closed).

A *simulator* (a world model of the tools) is given a state slice and one tool
call and predicts the tool's output and the state change. A step sample (see
``factory.envsim.steps``: ``state_before``, ``tool``, ``arguments``, ``observation``,
``delta``, ``state_after``, ``labels``) is exactly one such example, so this
module turns samples into prompts (``prompts/simulate.j2``) and alpaca rows
for LLaMA-Factory, reads predictions back, and scores them.

The model answers ``{"feedback": "<observation>", "config_changes": [ops]}``,
ops in the ``factory.core.delta`` format with pointers into the given slice.

Metrics (EnvSimBench's Feedback Match and Config Match):

* :func:`feedback_match` compares observations as parsed JSON when both sides
  are JSON (types kept: ``1``, ``1.0`` and ``true`` differ), else as stripped
  text.
* :func:`config_match` is **strict**: the predicted ops, applied to the state
  before, must give exactly the state after. An extra op, a wrong value, a
  stale ``before`` or an op that cannot be applied is a miss; a correct
  deletion is a hit.
* :func:`lenient_config_match` is EnvSimBench's Config Match exactly as its
  public evaluation code computes it (``factory.envsim.envsimbench``), for
  comparison with published numbers: the predicted changes are applied to the
  state before, and each change between the true states must find its
  ``after`` at its path. So extra wrong changes pass, a predicted ``null``
  instead of a deletion passes, overwriting a parent passes, and a correct
  deletion fails (the deleted path is absent).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from factory import packs
from factory.core.delta import DeltaError, apply, same_json
from factory.core.export import THINK_CLOSE, THINK_OPEN
from factory.core.labels import step_labels
from factory.core.repair import parse_json_value, reject_constant
from factory.envsim.rows import SampleError, alpaca_prompt
from factory.errors import FactoryError, RepairError, short

__all__ = [
    "SIM_MARKER",
    "STATE_MARKER",
    "TEMPLATE_PATH",
    "SampleError",
    "alpaca_prompt",
    "check_sample",
    "config_match",
    "feedback_match",
    "from_alpaca",
    "lenient_config_match",
    "parse_prediction",
    "render_prediction",
    "simulation_messages",
    "simulation_prompt",
    "to_alpaca",
    "unknown_tool_spec",
]

#: The line that opens the call block; the devserver recognises simulate prompts by it.
SIM_MARKER = "### Tool call to simulate"
#: The line that opens the state block.
STATE_MARKER = "### State"
#: The simulator prompt, shipped with the package (``prompts/simulate.j2``).
TEMPLATE_PATH = packs.shipped("prompts/simulate.j2")

_BLOCKS = ("system", "tool", "call", "user")
_JSON_COLUMNS = ("arguments", "state_before", "state_after", "delta", "labels")
_ALPACA_KEYS = ("instruction", "input", "output")
_CALL_BLOCK = re.compile(
    r"\A\s*### State\s*```json\n(?P<state>.*?)\n```\s*"
    r"### Tool call to simulate\s*```json\n(?P<call>.*?)\n```\s*\Z",
    re.S,
)
_THINK = re.compile(r"\A\s*<think>.*?</think>\s*", re.S)


# --- samples ---------------------------------------------------------------------------------


def check_sample(record: Mapping[str, Any]) -> dict[str, Any]:
    """A step-sample dict ready to prompt and score, from a JSONL or Parquet record.

    Parquet writers store the nested columns as JSON text (tool arguments have no
    fixed Arrow schema), so string values of ``arguments``, ``state_before``,
    ``state_after``, ``delta`` and ``labels`` are decoded. A missing
    ``state_after`` is computed from the Δ; a present one must agree with it,
    since Config Match scores against it. Missing labels are computed
    (``factory.core.labels.step_labels``), since the report breaks scores down by them.

    Returns:
        A new dict (the record is not modified).

    Raises:
        SampleError: a required field is missing or mistyped, or ``state_after``
            differs from ``apply(delta, state_before)``.
    """
    if not isinstance(record, Mapping):
        raise SampleError(f"a step sample is an object, got {type(record).__name__}")
    if "tool" not in record and all(isinstance(record.get(k), str) for k in _ALPACA_KEYS):
        record = from_alpaca(record)  # a row of an envsim run's data/ or heldout/ shards
    if "tool" not in record and isinstance(record.get("step_detail"), Mapping):
        from factory.envsim.envsimbench import from_record

        record = from_record(
            record
        )  # an EnvSimBench benchmark record  # a row of an envsim run's data/ or heldout/ shards
    if "tool" not in record and isinstance(record.get("sample"), str):
        # A row of an envsim run's candidates/ shards: the sample is one JSON column.
        try:
            record = json.loads(record["sample"])
        except ValueError as exc:
            raise SampleError(f"column sample holds text that is not JSON: {exc}") from None
        if not isinstance(record, Mapping):
            raise SampleError("column sample must hold a JSON object")
    sample = dict(record)
    for key in _JSON_COLUMNS:
        if isinstance(sample.get(key), str):
            try:
                sample[key] = json.loads(sample[key])
            except ValueError as exc:
                raise SampleError(f"column {key} holds text that is not JSON: {exc}") from None
    expected = {
        "tool": str,
        "arguments": dict,
        "state_before": dict,
        "observation": str,
        "delta": list,
    }
    for key, kind in expected.items():
        if not isinstance(sample.get(key), kind):
            got = type(sample.get(key)).__name__ if key in sample else "nothing"
            raise SampleError(f"field {key} must be a JSON {kind.__name__}, got {got}")
    try:
        after = apply(sample["delta"], sample["state_before"])
    except DeltaError as exc:
        raise SampleError(f"delta does not apply to state_before: {exc}") from None
    if sample.get("state_after") is None:
        sample["state_after"] = after
    elif not same_json(sample["state_after"], after):
        raise SampleError("state_after differs from apply(delta, state_before)")
    given = sample.get("labels")
    labels: dict[str, Any] = given if isinstance(given, dict) else {}
    computed = step_labels(sample["observation"], sample["delta"], sample["arguments"])
    sample["labels"] = {
        **labels,
        **{k: v for k, v in computed.items() if labels.get(k) is None},
    }
    return sample


def _json_text(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SampleError(f"{what} is not JSON: {exc}") from None


def from_alpaca(record: Mapping[str, Any]) -> dict[str, Any]:
    """The step sample an alpaca row of an envsim run (``data/``, ``heldout/``) teaches.

    Why parse the row and not keep a side file: the row is what the simulator is
    trained on, so scoring it needs nothing else. ``input`` holds the state and
    the call (the ``call`` block of ``prompts/simulate.j2``), ``output`` the
    answer (``feedback`` and ``config_changes``, a leading ``<think>`` block
    dropped); ``meta`` (JSON text) gives the labels and provenance. The sample
    carries ``prompt``, the row's user turn as LLaMA-Factory builds it
    (instruction, a newline, input), so a model is asked exactly what it was
    trained on. A row in EnvSimBench's SFT layout is read by
    :func:`factory.envsim.envsimbench.from_sft_row`.

    Raises:
        SampleError: the row is not in the envsim job's alpaca layout.
    """
    text = record["input"]
    if text.lstrip().startswith("{"):
        from factory.envsim.envsimbench import from_sft_row

        return from_sft_row(record)
    found = _CALL_BLOCK.match(text)
    if found is None:
        raise SampleError("alpaca input holds no '### State' and '### Tool call' blocks")
    call = _json_text(found["call"], "the tool call block")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise SampleError("the tool call block must be an object with a name")
    answer = _json_text(_THINK.sub("", record["output"], count=1), "output")
    if not isinstance(answer, dict) or "feedback" not in answer:
        raise SampleError("output must be an object with feedback and config_changes")
    meta = record.get("meta")
    meta = _json_text(meta, "meta") if isinstance(meta, str) else meta or {}
    sample: dict[str, Any] = {
        "id": record.get("id"),
        "env_id": meta.get("env_id"),
        "step": meta.get("step"),
        "tool": call["name"],
        "arguments": call.get("arguments"),
        "state_before": _json_text(found["state"], "the state block"),
        "observation": answer["feedback"],
        "delta": answer.get("config_changes"),
        "labels": meta.get("labels"),
        "prompt": alpaca_prompt(record),
    }
    return sample


def unknown_tool_spec(name: str) -> dict[str, Any]:
    """The spec shown for a called tool the environment does not have (a failure sample)."""
    return {
        "name": name,
        "description": "",
        "parameters": {"type": "object", "properties": {}},
    }


# --- prompts ---------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _template(path: str) -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(path).parent)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
        autoescape=False,
    )
    template = env.get_template(Path(path).name)
    missing = [b for b in _BLOCKS if b not in template.blocks]
    if missing:
        raise FactoryError(f"template {path} lacks block(s) {', '.join(missing)}")
    return template


def _public_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if not str(k).startswith("x-")}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def simulation_prompt(
    sample: Mapping[str, Any],
    tool_spec: Mapping[str, Any],
    code: str | None = None,
    facts: str | None = None,
) -> dict[str, str]:
    """The rendered blocks ``system``, ``tool``, ``call`` and ``user`` for one sample.

    ``system`` is the same for every sample; ``user`` is ``tool`` and ``call``
    joined by a blank line. The factory's ``x-`` keys are stripped from the spec.
    ``facts`` (the domain plug-in's ``simulator_facts``: the current time, the
    rule for new ids) go into the tool block, so every value of the answer is
    derivable from the prompt.
    """
    template = _template(str(TEMPLATE_PATH))
    context = template.new_context(
        {
            "tool_json": _dumps(_public_spec(tool_spec)),
            "code": code.strip("\n") if code else "",
            "facts": facts.strip() if facts else "",
            "state_json": _dumps(sample["state_before"]),
            "call_json": _dumps({"name": sample["tool"], "arguments": sample["arguments"]}),
        }
    )
    return {name: "".join(template.blocks[name](context)).strip() for name in _BLOCKS}


def simulation_messages(
    sample: Mapping[str, Any],
    tool_spec: Mapping[str, Any],
    code: str | None = None,
    facts: str | None = None,
) -> list[dict[str, str]]:
    """System and user chat messages asking a model to simulate ``sample``'s call."""
    blocks = simulation_prompt(sample, tool_spec, code, facts)
    return [
        {"role": "system", "content": blocks["system"]},
        {"role": "user", "content": blocks["user"]},
    ]


def render_prediction(feedback: str, config_changes: Sequence[Any]) -> str:
    """The answer text a perfect simulator gives (the training target)."""
    return _dumps({"feedback": feedback, "config_changes": list(config_changes)})


def to_alpaca(
    sample: Mapping[str, Any],
    *,
    tool_spec: Mapping[str, Any],
    code: str | None = None,
    reasoning: str | None = None,
    facts: str | None = None,
) -> dict[str, str]:
    """One LLaMA-Factory alpaca row teaching the simulator ``sample``.

    Args:
        sample: a step sample (``check_sample`` output or ``StepSample.to_dict()``).
        tool_spec: the called tool's function spec.
        code: the tool's source, shown after the spec when given.
        reasoning: written as ``<think>...</think>`` before the answer (LLaMA-Factory's
            thought words) when given.
        facts: the domain's facts a slice cannot show (see :func:`simulation_prompt`).

    Returns:
        ``{"system": the simulator's instructions, "instruction": tool spec (+ code,
        facts), "input": state + call, "output": answer}``. The instructions are the
        row's system prompt (LLaMA-Factory's ``system`` column), as a simulator is asked
        at inference (``simulation_messages``); without one a chat template inserts its
        own default ("You are Qwen ..."). The instruction repeats per tool, so a
        trainer's prefix sharing applies within a tool.
    """
    blocks = simulation_prompt(sample, tool_spec, code, facts)
    answer = render_prediction(sample["observation"], sample["delta"])
    if reasoning:
        answer = f"{THINK_OPEN}{reasoning.strip()}{THINK_CLOSE}{answer}"
    return {
        "system": blocks["system"],
        "instruction": blocks["tool"],
        "input": blocks["call"],
        "output": answer,
    }


# --- predictions -----------------------------------------------------------------------------


def parse_prediction(text: str) -> dict[str, Any]:
    """``{"feedback": str, "config_changes": list}`` from a model's answer.

    A leading ``<think>`` block and a markdown fence are dropped; almost-JSON is
    repaired only when ``factory.core.repair`` can show the repair is lossless. A
    feedback that comes back as JSON data (the model "parsed" the tool's JSON
    output) is kept as its JSON text, which :func:`feedback_match` compares as JSON.

    Raises:
        RepairError: ``unparsable_completion``: no JSON object, no ``feedback``,
            or ``config_changes`` missing or not a list.
    """
    if not isinstance(text, str):
        raise RepairError("unparsable_completion", f"expected text, got {type(text).__name__}")
    body = _THINK.sub("", text, count=1)
    value, _ = parse_json_value(body, reason="unparsable_completion")
    if not isinstance(value, dict):
        raise RepairError(
            "unparsable_completion", f"the answer is JSON {type(value).__name__}, not an object"
        )
    if "feedback" not in value:
        raise RepairError("unparsable_completion", "the answer has no 'feedback'")
    changes = value.get("config_changes")
    if not isinstance(changes, list):
        raise RepairError(
            "unparsable_completion",
            f"'config_changes' must be a list, got {short(changes, 60)}",
        )
    feedback = value["feedback"]
    if not isinstance(feedback, str):
        feedback = _dumps(feedback)
    return {"feedback": feedback, "config_changes": changes}


# --- metrics ---------------------------------------------------------------------------------

_NOT_JSON = object()


def _json_or_not(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        return _NOT_JSON


def feedback_match(pred_feedback: str, true_obs: str) -> bool:
    """Feedback Match: same JSON value (types compared) when both parse, else same stripped text."""
    if not isinstance(pred_feedback, str) or not isinstance(true_obs, str):
        return False
    pred, true = _json_or_not(pred_feedback), _json_or_not(true_obs)
    if pred is not _NOT_JSON and true is not _NOT_JSON:
        return same_json(pred, true)
    return pred_feedback.strip() == true_obs.strip()


def config_match(pred_ops: Any, state_before: Any, state_after: Any) -> bool:
    """Strict Config Match: ``apply(pred_ops, state_before)`` is exactly ``state_after``.

    Anything the ops cannot do (a malformed op, a missing path, a stale
    ``before``, ``pred_ops`` not a list) is a miss, not an error. Changes in
    EnvSimBench's format (dotted ``path``, ``type``) are read as the same ops.
    """
    if not isinstance(pred_ops, list):
        return False
    if any(isinstance(op, Mapping) and "type" in op and "op" not in op for op in pred_ops):
        from factory.envsim.envsimbench import pointer_ops

        pred_ops = pointer_ops(pred_ops)  # EnvSimBench's dotted changes, same rule
    try:
        result = apply(pred_ops, state_before)
    except (DeltaError, TypeError, ValueError, KeyError, AttributeError, RecursionError):
        return False
    return same_json(result, state_after)


def lenient_config_match(pred_ops: Any, state_before: Any, state_after: Any) -> bool:
    """EnvSimBench's Config Match, exactly as its evaluation code computes it (for comparison).

    ``factory.envsim.envsimbench.config_match``: a predicted ``null`` instead of a
    deletion passes, overwriting a parent path passes, extra wrong changes pass,
    and a correct deletion fails. Pointer ops are translated to its dotted paths.
    """
    from factory.envsim.envsimbench import config_match as envsimbench_config_match

    return envsimbench_config_match(pred_ops, state_before, state_after)
