"""Reason-coded checks of a text-action trajectory against its domain's grammar.

Why re-parse instead of trusting the stored calls: an agent turn's text is what is
trained on, and its ``tool_calls`` are only a view of it (``factory.core.formats.
textaction``); a trajectory read back from a cache, built by hand or edited by a
later stage is checked on the text, so a view that drifted from it is caught too.

The rules (AgentBench's episode shape): every agent turn holds exactly one
well-formed action of the grammar; a non-final action is answered by exactly one
observation; an observation answers an action; a final action (an answer, or an
action the grammar ends the episode with) is the last turn. With
``preamble_replies``, agent turns without an action are allowed before the first
action (AgentInstruct's "OK" after its instructions).
"""

from __future__ import annotations

from factory.core.grammar import ActionGrammar
from factory.core.reasons import Issue
from factory.core.trajectory import Trajectory

__all__ = ["ACTION_CODES", "check_actions"]

#: The reason codes this module reports, most fundamental first.
ACTION_CODES: tuple[str, ...] = (
    "no_action",
    "unknown_action",
    "malformed_action",
    "multiple_actions",
    "answer_not_last",
    "action_without_observation",
    "observation_without_action",
)

_BROKEN = -1  # a turn whose action did not parse: it excuses the observation after it


def check_actions(traj: Trajectory, grammar: ActionGrammar) -> list[Issue]:
    """Every action-level issue of ``traj``, in turn order.

    Args:
        traj: a text-action trajectory (its agent turns' text is parsed again).
        grammar: the domain's action grammar.

    Returns:
        Issues with reason codes of :data:`ACTION_CODES` (plus ``bad_field_type`` when a
        turn's stored call is not the one its text holds), ``turn`` set.
    """
    issues: list[Issue] = []
    pending: int | None = None  # the action turn waiting for its observation
    final_at: int | None = None
    acted = False
    for i, turn in enumerate(traj.turns):
        if final_at is not None:
            issues.append(
                Issue(
                    "answer_not_last",
                    f"turn {i} ({turn.role}) follows the final action of turn {final_at}",
                    turn=final_at,
                )
            )
            break
        if turn.role == "tool":
            if pending is None:
                issues.append(
                    Issue(
                        "observation_without_action", f"observation {i} answers no action", turn=i
                    )
                )
            pending = None
            continue
        if pending is not None and pending != _BROKEN:
            issues.append(_unanswered(traj, pending, f"turn {i} is not its observation"))
        pending = None
        if turn.role != "assistant":
            continue
        parsed = grammar.parse_turn(turn.content)
        if parsed.issues:
            (code, message), *_ = parsed.issues
            if code == "no_action" and grammar.preamble_replies and not acted:
                continue
            issues.append(Issue(code, message, turn=i))
            pending = _BROKEN if parsed.found else None
            continue
        acted = True
        assert parsed.call is not None
        stored = [(c.name, c.arguments) for c in turn.tool_calls]
        if stored != [(parsed.call.name, parsed.call.arguments)]:
            issues.append(
                Issue(
                    "bad_field_type",
                    f"turn {i}: its tool_calls are not the action its text holds",
                    turn=i,
                )
            )
        if parsed.final:
            final_at = i
        else:
            pending = i
    if pending is not None and pending != _BROKEN:
        issues.append(_unanswered(traj, pending, "the conversation ends"))
    return issues


def _unanswered(traj: Trajectory, turn: int, why: str) -> Issue:
    calls = traj.turns[turn].tool_calls
    name = calls[0].name if calls else "the action"
    return Issue(
        "action_without_observation", f"{name} in turn {turn} has no observation: {why}", turn=turn
    )
