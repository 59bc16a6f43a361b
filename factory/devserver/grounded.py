"""Grounded amplification answers: conversations executed on the prompt's environment state.

Why not rename the reference as ``simulate.amplify`` does: a grounded prompt
(``prompts/amplify_grounded.j2``) lists real entities, and the factory replays
every call of the answer on the full world (``factory.envsim.grounding``). Renamed
ids would exist nowhere, so every observation would contradict the executor.
The devserver therefore replays the reference's plot on a copy of the state in the
world of the domain the state belongs to (``factory.devserver.oracle``): every call is
*executed*, so the observations are the real ones. Nothing here is per domain: the
domain, its tool kinds and its enum values come from its plug-in's data
(``factory.devserver.domains``).

``corrupt_observation`` is the devserver's ``wrong_observation`` defect: one
observation changed the way a drifting simulator changes it (a count off by
one, another status), so ``verify`` must reject the answer and ``ground`` must
repair it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from typing import Any

from factory.devserver import domains
from factory.devserver.oracle import replay_on, subject_of
from factory.devserver.simulate import extract_block
from factory.envsim.grounding import ENV_STATE_MARKER

__all__ = [
    "ENV_STATE_MARKER",
    "corrupt_observation",
    "grounded_trajectory",
    "read_scenario",
]

State = dict[str, Any]


def read_scenario(text: str) -> State | None:
    """The state of a prompt's ``### Environment state`` block when a registered domain
    builds a world over it and it has a subject (a first record to talk about), else None."""
    block = extract_block(text, ENV_STATE_MARKER)
    if block is None:
        return None
    try:
        value = json.loads(block)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or subject_of(value) is None:
        return None
    return value if domains.world_over(value) is not None else None


def _calls(reference: Sequence[Mapping[str, Any]]) -> list[str]:
    return [
        str(c.get("name"))
        for m in reference
        for c in m.get("tool_calls") or ()
        if isinstance(c, Mapping)
    ]


def grounded_trajectory(
    scenario: State, reference: Sequence[Mapping[str, Any]], rng: random.Random
) -> dict[str, Any] | None:
    """The reference's plot replayed on ``scenario``, every call executed there.

    Args:
        scenario: a state :func:`read_scenario` returned; not modified.
        reference: the reference's messages in the amplification output format.
        rng: the request's content random source.

    Returns:
        ``{"messages": [...]}`` in the amplification output format, or None when no
        domain builds a world over the state or no call of the reference runs on it.
    """
    if subject_of(scenario) is None:
        return None
    found = domains.world_over(scenario, _calls(reference))
    if found is None:
        return None
    domain, env = found
    known = domains.facts(domain)
    messages = replay_on(env, reference, rng, tools=known.tools, enums=known.enums)
    return {"messages": messages} if messages else None


# --------------------------------------------------------------------------------------
# The wrong_observation defect
# --------------------------------------------------------------------------------------
def _leaves(value: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """(container, key) of every value a drifting simulator gets wrong: numbers, enum strings."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    enums = domains.enums()
    for key, item in items:
        if isinstance(item, (dict, list)):
            _leaves(item, out)
            continue
        number = isinstance(item, (int, float)) and not isinstance(item, bool)
        if number or (isinstance(key, str) and item in enums.get(key, ()) and len(enums[key]) > 1):
            out.append((value, key))
    return out


def _observation_leaves(content: Any) -> tuple[Any, list[tuple[Any, Any]]]:
    if not isinstance(content, str) or content.lstrip()[:1] not in ("{", "["):
        return None, []
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):
        return None, []
    return value, _leaves(value, []) if isinstance(value, (dict, list)) else []


def corrupt_observation(trajectory: dict[str, Any], rng: random.Random) -> bool:
    """Change one tool observation of ``trajectory`` in place so it contradicts the executor.

    A number becomes another number or an enum string (status, cabin, membership ...)
    another allowed value; an observation without such a value gets a wrong sentence.

    Returns:
        False when the trajectory has no tool message.
    """
    tools = [m for m in trajectory.get("messages", []) if m.get("role") == "tool"]
    if not tools:
        return False
    parsed = [(m, *_observation_leaves(m.get("content"))) for m in tools]
    with_leaves = [p for p in parsed if p[2]]
    if not with_leaves:
        message = rng.choice(tools)
        message["content"] = f"{message.get('content', '')} The request is still pending.".strip()
        return True
    message, value, leaves = rng.choice(with_leaves)
    container, key = rng.choice(leaves)
    old = container[key]
    if isinstance(old, str):
        container[key] = rng.choice([v for v in domains.enums()[key] if v != old])
    else:
        container[key] = old + rng.choice((1, 2, 5, 10, 50))
    message["content"] = json.dumps(value)
    return True
