"""Stratification labels of step samples and trajectories (the EnvSimBench groups).

Why labels at all: a training mix drawn at random from what the factory
produces is dominated by easy reads. EnvSimBench (Balance2) fixes the share of
each *group* instead, so the labels must say what kind of sample a row is,
cheaply and deterministically, before any payload is written.

Groups (:func:`group_for`), by outcome and exact |Δ| (number of state-change
ops, see :mod:`factory.core.delta`)::

    Failure     the action failed (an ``Error...`` observation) / the episode ended in one
    No-Change   |Δ| = 0
    Simple      |Δ| 1-2
    Medium      |Δ| 3-6
    Difficult   |Δ| 7-12
    Beyond      |Δ| > 12

Labels are plain JSON dicts. Keys common to both kinds:

* ``kind``: ``"step"`` or ``"trajectory"``;
* ``outcome``: step ``failure | no_change | change``; trajectory
  ``completed | refused | transferred | error``;
* ``group``: one of :data:`GROUPS`, or ``None`` for a trajectory whose exact
  |Δ| is unknown (no executor ran) and that did not end in an error;
* ``arg_cardinality``: top-level arguments of the call; for a trajectory the
  **maximum** over its calls (0 without calls). Max, not total, so the value
  means "the widest single call" for both kinds and does not grow with length;
* ``task_id`` / ``user_id`` / ``env_id``: provenance used for coverage and
  decontamination, ``None`` when unknown.

Step labels add ``delta_size`` (exact |Δ|). Trajectory labels add ``calls``
(tool calls made) and exactly one of ``delta_size`` (exact |Δ| from an
executor) or ``write_calls`` (write-tool calls whose observation is not an
error: a proxy, under a different name so it is never mistaken for |Δ|).

Text-action trajectories (:func:`action_labels`, a domain with an action grammar)
have the outcomes ``completed`` (success), ``error`` (an action met an error
observation, recovered from or not) and ``gave_up`` (the final action gives the
task up), and add ``error_observations`` and ``apps`` (the number of applications
their actions use, ``app_names`` lists them).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from factory.core.grammar import ActionGrammar
from factory.core.trajectory import ToolCall, Trajectory

__all__ = [
    "GROUPS",
    "STEP_OUTCOMES",
    "TRAJECTORY_OUTCOMES",
    "action_labels",
    "arg_cardinality",
    "call_observations",
    "call_pairs",
    "declines",
    "group_for",
    "is_error_observation",
    "step_labels",
    "trajectory_labels",
]

GROUPS: tuple[str, ...] = ("Failure", "No-Change", "Simple", "Medium", "Difficult", "Beyond")
STEP_OUTCOMES: tuple[str, ...] = ("failure", "no_change", "change")
TRAJECTORY_OUTCOMES: tuple[str, ...] = (
    "completed",
    "refused",
    "transferred",
    "error",
    "gave_up",
)
FAILURE_OUTCOMES = frozenset({"failure", "error"})

# Upper bound (inclusive) of |Δ| for each change group; Beyond is everything above.
_CHANGE_GROUPS: tuple[tuple[int, str], ...] = ((2, "Simple"), (6, "Medium"), (12, "Difficult"))

# The refusal heuristic: first-person inability, "unfortunately", or policy words.
_DECLINE = re.compile(
    r"\bunfortunately\b"
    r"|\bi(?:'m| am) (?:sorry|afraid),? but\b"
    r"|\b(?:i|we)(?:'m| am| are|'re)? (?:unable|not able) to\b"
    r"|\b(?:i|we) (?:cannot|can't|can not|won't be able to|am not allowed to)\b"
    r"|\bnot (?:eligible|permitted|allowed)\b"
    r"|\bagainst (?:the|our) policy\b",
    re.IGNORECASE,
)


def group_for(outcome: str, delta_size: int | None) -> str:
    """The EnvSimBench group of a sample.

    Args:
        outcome: any step or trajectory outcome; ``failure``/``error`` give Failure
            whatever ``delta_size`` says.
        delta_size: exact |Δ|; ``None`` is only allowed with a failure outcome.

    Raises:
        ValueError: unknown outcome, negative |Δ|, or ``None`` |Δ| for a non-failure
            (a write-call count is not |Δ|; leave such a sample without a group).
    """
    if outcome not in STEP_OUTCOMES and outcome not in TRAJECTORY_OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    if outcome in FAILURE_OUTCOMES:
        return "Failure"
    if delta_size is None:
        raise ValueError(f"outcome {outcome!r} needs an exact |Δ| to have a group")
    if isinstance(delta_size, bool) or not isinstance(delta_size, int) or delta_size < 0:
        raise ValueError(f"|Δ| must be a non-negative integer, got {delta_size!r}")
    if delta_size == 0:
        return "No-Change"
    for upper, name in _CHANGE_GROUPS:
        if delta_size <= upper:
            return name
    return "Beyond"


def is_error_observation(observation: str | None) -> bool:
    """tau-bench turns every tool exception into ``"Error: ..."``."""
    return isinstance(observation, str) and observation.startswith("Error")


def arg_cardinality(arguments: Any) -> int:
    """Number of top-level arguments of one call (0 when not an object)."""
    return len(arguments) if isinstance(arguments, Mapping) else 0


def step_labels(
    observation: str,
    delta_ops: list[Any],
    arguments: dict[str, Any],
    *,
    task_id: Any = None,
    user_id: Any = None,
    env_id: Any = None,
) -> dict[str, Any]:
    """Labels of one executed tool call.

    An error observation is a ``failure`` even if the executor reported ops (it
    should not); ``delta_size`` records what the executor said either way.

    Args:
        observation: the executor's observation text.
        delta_ops: the Δ ops of the call (``factory.core.delta.diff`` of before/after).
        arguments: the call's arguments.
        task_id, user_id, env_id: provenance, ``None`` when unknown.
    """
    delta_size = len(delta_ops)
    if is_error_observation(observation):
        outcome = "failure"
    elif delta_size == 0:
        outcome = "no_change"
    else:
        outcome = "change"
    return {
        "kind": "step",
        "outcome": outcome,
        "group": group_for(outcome, delta_size),
        "delta_size": delta_size,
        "arg_cardinality": arg_cardinality(arguments),
        "task_id": task_id,
        "user_id": user_id,
        "env_id": env_id,
    }


def call_pairs(traj: Trajectory) -> list[tuple[int, ToolCall, int | None]]:
    """Every call with its assistant turn and the tool turn answering it (``None`` if none does).

    Tool turns answer the calls of the assistant turn before them: by
    ``tool_call_id`` when both sides carry ids, else in call order.

    Returns:
        ``(assistant turn index, call, tool turn index or None)`` in call order.
    """
    pairs: list[tuple[int, ToolCall, int | None]] = []
    pending: list[int] = []  # indexes into pairs, unanswered calls of the last assistant turn
    for i, turn in enumerate(traj.turns):
        if turn.role == "assistant":
            pending = []
            for call in turn.tool_calls:
                pending.append(len(pairs))
                pairs.append((i, call, None))
        elif turn.role == "tool":
            if not pending:
                continue
            slot = next(
                (
                    k
                    for k in pending
                    if turn.tool_call_id is not None and pairs[k][1].id == turn.tool_call_id
                ),
                pending[0],
            )
            pending.remove(slot)
            pairs[slot] = (pairs[slot][0], pairs[slot][1], i)
        else:
            pending = []
    return pairs


def call_observations(traj: Trajectory) -> list[tuple[ToolCall, str | None]]:
    """Every call paired with the observation that answers it (``None`` if none does),
    by the rule of :func:`call_pairs`."""
    return [
        (call, None if answer is None else traj.turns[answer].content)
        for _, call, answer in call_pairs(traj)
    ]


def declines(text: str) -> bool:
    """Whether assistant text declines the request (the refusal heuristic)."""
    return bool(_DECLINE.search(text.replace("\u2019", "'")))


def _ended_in_error(traj: Trajectory) -> bool:
    last_tool = max((i for i, t in enumerate(traj.turns) if t.role == "tool"), default=None)
    if last_tool is None or not is_error_observation(traj.turns[last_tool].content):
        return False
    return not any(
        t.role == "assistant" and (t.content.strip() or t.tool_calls)
        for t in traj.turns[last_tool + 1 :]
    )


def _closing_texts(traj: Trajectory) -> list[str]:
    last_tool = max((i for i, t in enumerate(traj.turns) if t.role == "tool"), default=-1)
    return [t.content for t in traj.turns[last_tool + 1 :] if t.role == "assistant" and t.content]


def trajectory_labels(
    traj: Trajectory,
    *,
    write_tools: Collection[str],
    delta_size: int | None = None,
    transfer_tool: str = "transfer_to_human_agents",
) -> dict[str, Any]:
    """Labels of a whole episode.

    Outcome, first rule that holds:

    1. ``transferred``: a call to ``transfer_tool`` got a non-error observation;
    2. ``error``: the last tool observation is an error and no assistant turn
       after it says or calls anything (the episode ended on the failure; an
       agent that answers the user after an error has recovered, and rules 3-4
       decide);
    3. ``refused``: no write call succeeded (got a non-error observation) and an
       assistant text after the last tool observation (all of them when there
       is none) :func:`declines` - "unfortunately", "I can't / I'm unable to",
       "not eligible / allowed / permitted", "against the policy". The closing
       texts, not only the very last one, because agents decline and then
       answer the user's "thanks";
    4. ``completed`` otherwise.

    Args:
        traj: the trajectory.
        write_tools: names of the state-changing tools (``Domain.write_tools()``).
        delta_size: exact |Δ| when an executor replayed the episode; without it
            the labels carry ``write_calls`` instead and no group unless ``error``.
        transfer_tool: the hand-off tool of the domain.
    """
    pairs = call_observations(traj)
    ok = [(c, obs) for c, obs in pairs if obs is not None and not is_error_observation(obs)]
    writes_ok = sum(1 for c, _ in ok if c.name in write_tools)
    if any(c.name == transfer_tool for c, _ in ok):
        outcome = "transferred"
    elif _ended_in_error(traj):
        outcome = "error"
    elif writes_ok == 0 and any(declines(text) for text in _closing_texts(traj)):
        outcome = "refused"
    else:
        outcome = "completed"

    meta = traj.metadata
    labels: dict[str, Any] = {
        "kind": "trajectory",
        "outcome": outcome,
        "group": (
            group_for(outcome, delta_size)
            if delta_size is not None or outcome in FAILURE_OUTCOMES
            else None
        ),
        "arg_cardinality": max((arg_cardinality(c.arguments) for c, _ in pairs), default=0),
        "calls": len(pairs),
        "task_id": meta.get("task_id"),
        "user_id": meta.get("user_id"),
        "env_id": meta.get("env_id"),
    }
    if delta_size is not None:
        labels["delta_size"] = delta_size
    else:
        labels["write_calls"] = writes_ok
    return labels


def action_labels(traj: Trajectory, grammar: ActionGrammar) -> dict[str, Any]:
    """Labels of a text-action episode (an action-valid trajectory of a grammar's domain).

    Outcome, first rule that holds: ``gave_up`` when the last action matches one of
    the grammar's ``give_up`` forms; ``error`` when any observation is an error
    (``observations.error``): the trajectory teaches an error observation; else
    ``completed``. Why any error and not the last one: a text agent always ends on
    its final action, so "ended in an error" would never hold; what a mix needs to
    balance is whether the agent met a failure.

    Args:
        traj: the trajectory (calls parsed from its agent turns).
        grammar: the domain's action grammar (error observations, give-up forms, apps).
    """
    pairs = call_observations(traj)
    errors = sum(1 for _, obs in pairs if obs is not None and grammar.is_error(obs))
    last = pairs[-1][0] if pairs else None
    if last is not None and grammar.gives_up(last):
        outcome = "gave_up"
    elif errors:
        outcome = "error"
    else:
        outcome = "completed"
    apps = list(dict.fromkeys(a for c, _ in pairs if (a := grammar.app_of(c.name)) is not None))
    meta = traj.metadata
    return {
        "kind": "trajectory",
        "outcome": outcome,
        "group": group_for(outcome, None) if outcome in FAILURE_OUTCOMES else None,
        "arg_cardinality": max((arg_cardinality(c.arguments) for c, _ in pairs), default=0),
        "calls": len(pairs),
        "error_observations": errors,
        "apps": len(apps),
        "app_names": apps,
        "task_id": meta.get("task_id"),
        "user_id": meta.get("user_id"),
        "env_id": meta.get("env_id"),
    }
