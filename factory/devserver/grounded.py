"""Grounded amplification answers: conversations executed on the prompt's environment state.

Why not rename the reference as ``simulate.amplify`` does: a grounded prompt
(``prompts/amplify_grounded.j2``) lists real entities, and the factory replays
every call of the answer on the full world (``factory.envsim.grounding``). Renamed
ids would exist nowhere, so every observation would contradict the executor.
The devserver therefore asks the domain whose state the prompt shows (its
plug-in's ``devserver`` part) to play a short episode whose every call is
*executed* on a copy of that state: the observations are the real ones.

``corrupt_observation`` is the devserver's ``wrong_observation`` defect: one
observation changed the way a drifting simulator changes it (a count off by
one, another status), so ``verify`` must reject the answer and ``ground`` must
repair it.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Collection
from typing import Any

from factory.devserver.simulate import extract_block
from factory.envs.plugin import DevserverHooks
from factory.envs.registry import available_domains, get_plugin
from factory.envsim.grounding import ENV_STATE_MARKER

__all__ = [
    "ENV_STATE_MARKER",
    "corrupt_observation",
    "grounded_trajectory",
    "read_scenario",
]

State = dict[str, Any]


@functools.cache
def _hooks() -> tuple[DevserverHooks, ...]:
    """The devserver parts of every registered domain, in name order."""
    found = []
    for name in available_domains("devserver"):
        hooks = get_plugin(name).devserver
        assert hooks is not None
        found.append(hooks)
    return tuple(found)


@functools.cache
def _enums() -> dict[str, tuple[str, ...]]:
    merged: dict[str, tuple[str, ...]] = {}
    for hooks in _hooks():
        for key, values in hooks.observation_enums.items():
            merged[key] = (
                *merged.get(key, ()),
                *(v for v in values if v not in merged.get(key, ())),
            )
    return merged


def read_scenario(text: str) -> State | None:
    """The state of a prompt's ``### Environment state`` block if a domain knows it, or None."""
    block = extract_block(text, ENV_STATE_MARKER)
    if block is None:
        return None
    try:
        value = json.loads(block)
    except (ValueError, RecursionError):
        return None
    for hooks in _hooks():
        state = hooks.read_state(value)
        if state is not None:
            return state
    return None


def grounded_trajectory(
    scenario: State, rng: random.Random, *, reference_tools: Collection[str] = ()
) -> dict[str, Any] | None:
    """A conversation whose every call was executed on ``scenario``, played by its domain.

    Args:
        scenario: a state :func:`read_scenario` returned; not modified.
        rng: the request's content random source.
        reference_tools: tools the reference calls (they steer the plot).

    Returns:
        ``{"messages": [...]}`` in the amplification output format, or None when
        no domain can play the state.
    """
    for hooks in _hooks():
        if hooks.read_state(scenario) is not None:
            return hooks.play(scenario, rng, reference_tools)
    return None


# --------------------------------------------------------------------------------------
# The wrong_observation defect
# --------------------------------------------------------------------------------------
def _leaves(value: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """(container, key) of every value a drifting simulator gets wrong: numbers, enum strings."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(item, (dict, list)):
            _leaves(item, out)
            continue
        number = isinstance(item, (int, float)) and not isinstance(item, bool)
        if number or (isinstance(key, str) and item in _enums().get(key, ())):
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
        container[key] = rng.choice([v for v in _enums()[key] if v != old])
    else:
        container[key] = old + rng.choice((1, 2, 5, 10, 50))
    message["content"] = json.dumps(value)
    return True
