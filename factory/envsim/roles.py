"""The prompts of the LLM roles of a simulated RL environment, and how their answers are read.

Simia-RL lets an LLM play what a real environment would: the **user** (driven by a
task's instruction), the **tools** (from their specs, the policy, a reference
trajectory and the history, told to explain failures) and the **judge** (0/1 and
reasons at the end of an episode); a fourth role **derives a task** from a seed
trajectory. ``factory.simenv`` renders these prompts and reads the answers; the
development server (``factory.devserver.roles``) recognises them by their marker
line and plays every role offline. One module holds both sides of the format so the
two cannot drift apart.

Each prompt is a system message (what the role is) and a user message ending in a
marker line followed by one JSON object (the payload). The payload, not prose,
carries what the answer depends on, so the devserver reads it back exactly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from factory.core.repair import parse_json_value
from factory.errors import RepairError, short

__all__ = [
    "DERIVE_MARKER",
    "JUDGE_MARKER",
    "MARKERS",
    "STOP",
    "TOOL_MARKER",
    "USER_MARKER",
    "derive_messages",
    "judge_messages",
    "parse_derived",
    "parse_judgement",
    "parse_tool_answer",
    "parse_user_answer",
    "read_payload",
    "role_of",
    "tool_messages",
    "user_messages",
]

USER_MARKER = "### Conversation so far (you are the user)"
TOOL_MARKER = "### Tool call to answer"
JUDGE_MARKER = "### Episode to judge"
DERIVE_MARKER = "### Seed trajectory to derive a task from"
MARKERS: dict[str, str] = {
    "user": USER_MARKER,
    "tool": TOOL_MARKER,
    "judge": JUDGE_MARKER,
    "derive": DERIVE_MARKER,
}
#: What the user simulator says to end the episode (tau-bench's convention).
STOP = "###STOP###"


def _messages(
    system: str, intro: str, marker: str, payload: Mapping[str, Any]
) -> list[dict[str, str]]:
    body = json.dumps(payload, ensure_ascii=False, sort_keys=True)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"{intro}\n\n{marker}\n{body}"},
    ]


def role_of(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """The role a chat request asks for (a key of :data:`MARKERS`), or None."""
    if not messages:
        return None
    text = messages[-1].get("content")
    if not isinstance(text, str):
        return None
    lines = set(text.splitlines())
    for role, marker in MARKERS.items():
        if marker in lines:
            return role
    return None


def read_payload(messages: Sequence[Mapping[str, Any]], role: str) -> dict[str, Any] | None:
    """The JSON payload after the role's marker in the last message, or None when unreadable."""
    text = messages[-1].get("content") if messages else None
    if not isinstance(text, str):
        return None
    marker = MARKERS[role]
    at = text.rfind("\n" + marker + "\n")
    if at < 0:
        return None
    try:
        value = json.loads(text[at + len(marker) + 2 :])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- the user -------------------------------------------------------------------------------
_USER_SYSTEM = (
    "You play a customer talking to a support agent. Follow your instruction; reveal only "
    "what the agent asks for, one step at a time; do not invent facts the instruction does "
    f"not give. When your goal is met, or cannot be met, answer with {STOP} alone."
)


def user_messages(
    instruction: str, conversation: Sequence[Mapping[str, str]]
) -> list[dict[str, str]]:
    """The user simulator's prompt.

    Args:
        instruction: the task's instruction (who the user is, what they want).
        conversation: ``{"role": "agent"|"user", "content"}`` turns so far (empty at reset).
    """
    payload = {"instruction": instruction, "conversation": list(conversation)}
    intro = "Write your next message to the agent (the first one if the conversation is empty)."
    return _messages(_USER_SYSTEM, intro, USER_MARKER, payload)


def parse_user_answer(text: str) -> tuple[str, bool]:
    """``(message, done)``: the user's message, and whether it ends the episode."""
    message = text.strip()
    done = STOP in message
    return message.replace(STOP, "").strip() if done else message, done


# --- the tools ------------------------------------------------------------------------------
_TOOL_SYSTEM = (
    "You simulate the tools of a service. Given the tool specifications, the service's "
    "policy, a reference trajectory of the same service and the calls made so far, answer "
    "the new call as the real tool would, consistently with everything returned before. "
    "When the call cannot succeed, answer with an error that explains why (which argument, "
    'which record, which rule). Answer with JSON: {"observation": "<the tool output>"}.'
)


def tool_messages(
    *,
    tools: Sequence[Mapping[str, Any]],
    policy: str,
    reference: Sequence[Mapping[str, Any]] | None,
    history: Sequence[Mapping[str, Any]],
    call: Mapping[str, Any],
) -> list[dict[str, str]]:
    """The tool simulator's prompt (Simia-RL's: tools, policy, a reference, the history).

    Args:
        tools: bare tool specs (name, description, parameters).
        policy: the domain policy text.
        reference: chat messages of one seed trajectory of the domain, or None.
        history: ``{"name", "arguments", "observation"}`` of the calls so far.
        call: ``{"name", "arguments"}`` of the call to answer.
    """
    system = _TOOL_SYSTEM + "\n\n## Tools\n" + json.dumps(list(tools), ensure_ascii=False)
    if policy:
        system += "\n\n## Policy\n" + policy
    payload = {
        "reference": list(reference or ()),
        "history": list(history),
        "call": dict(call),
    }
    return _messages(system, "Answer the call below.", TOOL_MARKER, payload)


def parse_tool_answer(text: str) -> str:
    """The observation text of a tool simulator's answer (a JSON string kept as is).

    Raises:
        RepairError: ``unparsable_completion``: no JSON object with an ``observation``.
    """
    value, _ = parse_json_value(text, reason="unparsable_completion")
    if not isinstance(value, dict) or "observation" not in value:
        raise RepairError(
            "unparsable_completion", f"no observation in the tool answer {short(text, 120)!r}"
        )
    obs = value["observation"]
    return obs if isinstance(obs, str) else json.dumps(obs, ensure_ascii=False)


# --- the judge ------------------------------------------------------------------------------
_JUDGE_SYSTEM = (
    "You judge whether a support agent completed a customer's task. Reward 1 only when the "
    "final state of the service is exactly what the task needs (every expected action taken "
    "with the expected arguments, nothing else changed) and every required output was told "
    'to the user; else 0. Answer with JSON: {"reward": 0 or 1, "reasons": ["..."]}.'
)


def judge_messages(
    *,
    instruction: str,
    expected_actions: Sequence[Mapping[str, Any]],
    outputs: Sequence[str],
    expected_outcome: str,
    episode: Sequence[Mapping[str, Any]],
) -> list[dict[str, str]]:
    """The judge's prompt over a finished episode.

    Args:
        instruction: the task's instruction.
        expected_actions: ``{"name", "arguments"}`` the task's ground truth takes (may be empty).
        outputs: strings the agent must tell the user.
        expected_outcome: prose for tasks without ground-truth actions ("" otherwise).
        episode: the episode's chat messages (assistant calls with ``tool_calls``).
    """
    payload = {
        "instruction": instruction,
        "expected_actions": list(expected_actions),
        "outputs": list(outputs),
        "expected_outcome": expected_outcome,
        "episode": list(episode),
    }
    return _messages(_JUDGE_SYSTEM, "Judge the episode below.", JUDGE_MARKER, payload)


def parse_judgement(text: str) -> tuple[float, list[str]]:
    """``(reward, reasons)`` with reward 0.0 or 1.0.

    Raises:
        RepairError: ``unparsable_completion``: no object, or a reward other than 0/1.
    """
    value, _ = parse_json_value(text, reason="unparsable_completion")
    reward = value.get("reward") if isinstance(value, dict) else None
    if isinstance(reward, bool) or reward not in (0, 1):
        raise RepairError(
            "unparsable_completion", f"the judge gave no 0/1 reward: {short(text, 120)!r}"
        )
    reasons = value.get("reasons")
    if isinstance(reasons, str):
        reasons = [reasons]
    if not isinstance(reasons, list):
        reasons = []
    return float(reward), [str(r) for r in reasons]


# --- deriving tasks from seeds --------------------------------------------------------------
_DERIVE_SYSTEM = (
    "You turn a recorded support conversation into a task for a user simulator. Write the "
    "user's instruction in the second person (who they are, what they want, what they "
    "know, how they behave) and the expected outcome (what the service's state must look "
    'like at the end). Answer with JSON: {"instruction": "...", "expected_outcome": "..."}.'
)


def derive_messages(seed: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The prompt that derives a task from one seed trajectory's chat messages."""
    return _messages(
        _DERIVE_SYSTEM, "Derive the task of the conversation below.", DERIVE_MARKER,
        {"messages": list(seed)},
    )  # fmt: skip


def parse_derived(text: str) -> tuple[str, str]:
    """``(instruction, expected_outcome)``.

    Raises:
        RepairError: ``unparsable_completion``: no object or an empty instruction.
    """
    value, _ = parse_json_value(text, reason="unparsable_completion")
    instruction = value.get("instruction") if isinstance(value, dict) else None
    if not isinstance(instruction, str) or not instruction.strip():
        raise RepairError("unparsable_completion", f"no instruction in {short(text, 120)!r}")
    outcome = value.get("expected_outcome")
    return instruction.strip(), outcome if isinstance(outcome, str) else ""
