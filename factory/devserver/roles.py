"""The development server plays the roles of a simulated RL environment (``factory.simenv``).

Why rules and not a model: tests and benchmarks need a user, a tool simulator and a
judge that answer offline, instantly and identically under a seed, and whose verdicts
are *right* where a right answer exists, so a test can tell a correct policy from a
wrong one. Each answer depends only on the prompt's payload (``factory.envsim.roles``)
and the request's content seed:

* **user**: the first message restates the instruction in the first person; later,
  a question from the agent gets a yes, anything else ends the episode (``###STOP###``).
* **tool**: the observation the reference trajectory recorded for the same call (same
  name and arguments, else the same tool's first success, else ``{"status": "ok"}``);
  an unknown tool gets an error that explains itself.
* **judge**: 1 when every expected action was made with exactly its arguments (and did
  not fail), no other call changed a tool the task writes, and every required output
  was said; else 0, with the reason.
* **derive**: the instruction is what the seed's user said, the expected outcome the
  calls the seed's agent made.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from factory.core.trajectory import canonical_json
from factory.envsim.roles import MARKERS, STOP, read_payload, role_of

__all__ = ["KINDS", "answer", "kind_of"]

KINDS: tuple[str, ...] = tuple(f"rl_{role}" for role in MARKERS)
_YES = ("Yes, please go ahead.", "Yes, that is right.", "Yes, please.")
_MAX_USER_TURNS = 30


def kind_of(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """``rl_<role>`` for a prompt of ``factory.envsim.roles``, else None."""
    role = role_of(messages)
    return None if role is None else f"rl_{role}"


def answer(kind: str, messages: Sequence[Mapping[str, Any]], rng: random.Random) -> str:
    """The answer text to a role prompt (``kind`` from :func:`kind_of`)."""
    role = kind.removeprefix("rl_")
    payload = read_payload(messages, role)
    if payload is None:
        return f"I could not read the {role} prompt's JSON payload."
    if role == "user":
        return _user(payload, rng)
    if role == "tool":
        system = messages[0].get("content") if len(messages) > 1 else ""
        return json.dumps({"observation": _tool(payload, str(system or ""))})
    if role == "judge":
        reward, reasons = _judge(payload)
        return json.dumps({"reward": reward, "reasons": reasons})
    return json.dumps(_derive(payload))


_PERSON = [(r"\bYou are\b", "I am"), (r"\byou are\b", "I am"), (r"\bYou\b", "I"),
           (r"\byou\b", "I"), (r"\bYour\b", "My"), (r"\byour\b", "my")]  # fmt: skip


def _first_person(text: str) -> str:
    for pattern, repl in _PERSON:
        text = re.sub(pattern, repl, text)
    return text


def _user(payload: Mapping[str, Any], rng: random.Random) -> str:
    conversation = [t for t in payload.get("conversation") or () if isinstance(t, dict)]
    if not conversation:
        return "Hi! " + _first_person(str(payload.get("instruction") or "I need help."))
    said = sum(1 for t in conversation if t.get("role") == "user")
    last = str(conversation[-1].get("content") or "").strip()
    if said < _MAX_USER_TURNS and last.endswith("?"):
        return rng.choice(_YES)
    return f"Thank you, that is all. {STOP}"


def _same(a: Any, b: Any) -> bool:
    return canonical_json(a) == canonical_json(b)


def _tool(payload: Mapping[str, Any], system: str) -> str:
    raw = payload.get("call")
    call: Mapping[str, Any] = raw if isinstance(raw, dict) else {}
    name, arguments = call.get("name"), call.get("arguments")
    if f'"name": {json.dumps(name)}' not in system:
        return f"Error: unknown tool {name!r}: the service has no tool of that name"
    by_name: str | None = None
    messages = [m for m in payload.get("reference") or () if isinstance(m, dict)]
    for i, message in enumerate(messages):
        for c in message.get("tool_calls") or ():
            if not isinstance(c, dict) or c.get("name") != name:
                continue
            reply = next((m for m in messages[i + 1 :] if m.get("role") == "tool"), None)
            if reply is None:
                continue
            if _same(c.get("arguments"), arguments):
                return str(reply.get("content") or "")
            text = str(reply.get("content") or "")
            if by_name is None and not text.startswith("Error"):
                by_name = text  # the same tool's success, for other arguments
    return by_name if by_name is not None else json.dumps({"status": "ok"})


def _calls(episode: Sequence[Mapping[str, Any]]) -> list[tuple[str, Any, bool]]:
    """``(name, arguments, failed)`` of every call of an episode, in order."""
    out: list[tuple[str, Any, bool]] = []
    pending: list[tuple[str, Any]] = []
    for message in episode:
        if message.get("role") == "assistant":
            out.extend((n, a, True) for n, a in pending)  # unanswered calls count as failed
            pending = [
                (str(c.get("name")), c.get("arguments"))
                for c in message.get("tool_calls") or ()
                if isinstance(c, dict)
            ]
        elif message.get("role") == "tool" and pending:
            name, arguments = pending.pop(0)
            failed = str(message.get("content") or "").startswith("Error")
            out.append((name, arguments, failed))
    out.extend((n, a, True) for n, a in pending)
    return out


def _judge(payload: Mapping[str, Any]) -> tuple[int, list[str]]:
    episode = [m for m in payload.get("episode") or () if isinstance(m, dict)]
    made = [(n, a) for n, a, failed in _calls(episode) if not failed]
    expected = [a for a in payload.get("expected_actions") or () if isinstance(a, dict)]
    reasons: list[str] = []
    left = list(made)
    for action in expected:
        hit = next(
            (i for i, (n, a) in enumerate(left)
             if n == action.get("name") and _same(a, action.get("arguments"))),
            None,
        )  # fmt: skip
        if hit is None:
            reasons.append(f"expected action {action.get('name')} was not made as required")
        else:
            left.pop(hit)
    written = {a.get("name") for a in expected}
    reasons.extend(f"unexpected {n} call changed the outcome" for n, _ in left if n in written)
    said = (
        " ".join(str(m.get("content") or "") for m in episode if m.get("role") == "assistant")
        .lower()
        .replace(",", "")
    )
    reasons.extend(
        f"required output {o!r} was not told to the user"
        for o in payload.get("outputs") or ()
        if str(o).lower().replace(",", "") not in said
    )
    if not expected and not payload.get("outputs") and any(f for _, _, f in _calls(episode)[-1:]):
        reasons.append("the episode ends on a failed call")
    return (0, reasons) if reasons else (1, ["every expected action and output is there"])


def _derive(payload: Mapping[str, Any]) -> dict[str, str]:
    messages = [m for m in payload.get("messages") or () if isinstance(m, dict)]
    said = [str(m.get("content") or "") for m in messages if m.get("role") == "user"]
    calls = [
        f"{c.get('name')}({canonical_json(c.get('arguments'))})"
        for m in messages
        for c in m.get("tool_calls") or ()
        if isinstance(c, dict)
    ]
    instruction = "You are the customer of this conversation. You say, in order: " + " | ".join(
        s for s in said if s
    )
    outcome = "The agent makes these calls: " + ("; ".join(calls) if calls else "none")
    return {"instruction": instruction, "expected_outcome": outcome}
