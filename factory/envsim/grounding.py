"""Grounding: check (or fix) an LLM-written trajectory against an executable world.

Why: in one-pass amplification the model writes the tool observations too, and
a model that simulates the environment drifts (a refund that does not add up,
a reservation whose status changes between two reads). Where a domain is
executable, the prompt gets a real slice of the world (:meth:`GroundingWorld.scenario`)
so the model uses entities that exist, and afterwards every call of the
answer is replayed on a fresh fork of the *full* world (:func:`replay`):
the executor's observation is the ground truth. :func:`apply_mode` then
rejects a contradicting trajectory (``verify``), replaces the simulated
observations with the executed ones (``ground``) or only measures (``off``).

Observations are compared the way EnvSimBench's Feedback Match does it
(:func:`factory.envsim.simulator.feedback_match`): as JSON values with their types
(``1``, ``1.0`` and ``true`` differ) when both sides parse, else as stripped
text. Calls are paired with the tool turns that answer them by the rule of
:func:`factory.core.labels.call_pairs` (ids when both carry one, else order).

Everything here is pure (no Ray, no LLM); the stages call it per row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from factory.core.delta import changed_size
from factory.core.labels import call_pairs
from factory.core.trajectory import Trajectory, Turn
from factory.envs.base import Environment
from factory.envs.registry import generate_environment, get_environment, get_plugin
from factory.envsim.sampler import world_env_id
from factory.envsim.simulator import feedback_match
from factory.errors import ConfigError, short

__all__ = [
    "ENV_STATE_MARKER",
    "MODES",
    "CallCheck",
    "GroundingResult",
    "GroundingWorld",
    "apply_mode",
    "render_scenario",
    "replay",
]

#: The heading of the scenario block in a grounded amplification prompt (the devserver reads it).
ENV_STATE_MARKER = "### Environment state"
MODES: tuple[str, ...] = ("verify", "ground", "off")
Mode = Literal["verify", "ground", "off"]

SHOWN_CHARS = 600  # observations kept in a CallCheck (the full texts stay in the result)


# --- the world and its scenarios ------------------------------------------------------------


class GroundingWorld:
    """One executable world, built once per actor, that prompts are grounded in.

    The domain's plug-in supplies the world (``environment``) and the slices the
    prompts show (``grounding``); this class only builds them and checks that a
    replay uses the world the prompts came from.

    Args:
        domain: a registered domain with an ``environment`` and a ``grounding`` part.
        world_seed: seed of the domain's world generator (ignored with ``db_dir``).
        sizes: generator sizes (the plug-in's ``world_sizes``); ``None`` means its defaults.
        db_dir: a database folder to use instead of a generated world.
        validate_arguments: passed to the environment (wrong-typed calls become errors).

    Raises:
        ConfigError: an unknown domain or one without grounding, a bad or unknown
            size, an unreadable ``db_dir``, or a world the scenarios cannot use.
    """

    def __init__(
        self,
        domain: str,
        world_seed: int = 0,
        sizes: Mapping[str, Any] | None = None,
        *,
        db_dir: str | Path | None = None,
        validate_arguments: bool = True,
    ):
        plugin = get_plugin(domain, needs="grounding")
        assert plugin.grounding is not None
        self.domain = domain
        if db_dir is not None:
            self.env: Environment = get_environment(
                domain, db_dir=db_dir, validate_arguments=validate_arguments
            )
            self.env_id = f"{domain}-db-{Path(db_dir).name}"
        else:
            self.env = generate_environment(
                domain, world_seed, sizes, validate_arguments=validate_arguments
            )
            self.env_id = world_env_id(domain, world_seed, sizes)
        self._scenarios = plugin.grounding(self.env)

    def scenario(self, index: int, rng_seed: int) -> dict[str, Any]:
        """The state slice shown in the prompt of call ``index`` (same arguments, same slice)."""
        return self._scenarios.scenario(index, rng_seed)

    def subject(self, scenario: Mapping[str, Any]) -> str | None:
        """Who the scenario is about (a user id), recorded in the row's grounding info."""
        return self._scenarios.subject(scenario)

    def fresh_env(self, scenario: Mapping[str, Any] | None = None) -> Environment:
        """A fork of the whole world (not of the slice: a model may search other flights).

        Args:
            scenario: the scenario the trajectory was written from; when given it
                is checked to come from this world, which catches a replay built
                with another seed or other sizes than the prompts.

        Raises:
            ConfigError: ``scenario`` does not match this world.
        """
        if scenario is not None:
            problem = self._scenarios.mismatch(scenario)
            if problem:
                raise ConfigError(
                    f"the scenario does not come from this world ({problem}); build the "
                    "GroundingWorld with the domain, seed and sizes the prompts used",
                    key_path="world_seed",
                )
        return self.env.copy()


def render_scenario(scenario: Mapping[str, Any]) -> str:
    """The scenario as the JSON text of the prompt's ``### Environment state`` block.

    One entity per line (compact inside): a third fewer tokens than indented
    JSON, and still easy to scan by id. ``json.loads`` gives the scenario back.
    """
    tables = []
    for table, entries in scenario.items():
        if isinstance(entries, Mapping) and entries:
            rows = ",\n".join(
                f"  {json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"
                for key, value in entries.items()
            )
            tables.append(f" {json.dumps(table)}: {{\n{rows}\n }}")
        else:
            tables.append(f" {json.dumps(table)}: {json.dumps(entries, ensure_ascii=False)}")
    return "{\n" + ",\n".join(tables) + "\n}"


# --- replay -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallCheck:
    """One call of a replayed trajectory; observations truncated to :data:`SHOWN_CHARS`."""

    index: int  # position among the trajectory's calls
    turn: int  # the assistant turn that makes the call
    tool: str
    matched: bool
    simulated: str | None  # None: no tool turn answers the call
    executed: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "turn": self.turn,
            "tool": self.tool,
            "matched": self.matched,
            "simulated": self.simulated,
            "executed": self.executed,
        }


@dataclass(frozen=True)
class GroundingResult:
    """What replaying a trajectory on an executor found.

    ``observations`` are the executor's full texts, one per call, in call order;
    ``delta_size`` is the exact |Δ| of the whole trajectory on the executor
    (see :func:`factory.core.delta.changed_size`).
    """

    steps: tuple[CallCheck, ...]
    observations: tuple[str, ...]
    delta_size: int

    @property
    def total(self) -> int:
        return len(self.steps)

    @property
    def matched(self) -> int:
        return sum(1 for s in self.steps if s.matched)

    @property
    def fidelity(self) -> float:
        """Share of calls whose simulated observation matches the executed one (1.0 if none)."""
        return self.matched / self.total if self.steps else 1.0

    @property
    def first_mismatch(self) -> dict[str, Any] | None:
        """``{"index", "turn", "tool"}`` of the first contradicted call, or ``None``."""
        for s in self.steps:
            if not s.matched:
                return {"index": s.index, "turn": s.turn, "tool": s.tool}
        return None

    def summary(self) -> dict[str, Any]:
        """The JSON-safe numbers every mode reports."""
        return {
            "fidelity": self.fidelity,
            "matched": self.matched,
            "total": self.total,
            "delta_size": self.delta_size,
        }


def replay(traj: Trajectory, env: Environment) -> GroundingResult:
    """Execute every call of ``traj`` in order on ``env`` and compare the observations.

    Args:
        traj: the trajectory (not modified).
        env: a fresh fork of the world the trajectory starts in
            (:meth:`GroundingWorld.fresh_env`); it is stepped.

    Returns:
        The per-call comparison, the executed observations and the exact |Δ|.
        A call no tool turn answers is a mismatch.
    """
    start = env.copy()
    pairs = call_pairs(traj)
    steps: list[CallCheck] = []
    observations: list[str] = []
    for index, (turn, call, answer) in enumerate(pairs):
        executed = env.execute(call.name, call.arguments)
        simulated = traj.turns[answer].content if answer is not None else None
        matched = simulated is not None and feedback_match(simulated, executed)
        observations.append(executed)
        steps.append(
            CallCheck(
                index=index,
                turn=turn,
                tool=call.name,
                matched=matched,
                simulated=None if simulated is None else short(simulated, SHOWN_CHARS),
                executed=short(executed, SHOWN_CHARS),
            )
        )
    return GroundingResult(
        steps=tuple(steps),
        observations=tuple(observations),
        delta_size=changed_size(start.state, env.state),
    )


# --- what to do with the result ------------------------------------------------------------


def _mismatch_message(result: GroundingResult) -> str:
    first = next(s for s in result.steps if not s.matched)
    where = f"call {first.index} ({short(first.tool, 60)}, turn {first.turn})"
    executed = short(first.executed, 120)
    if first.simulated is None:
        return f"{where} has no observation; the executor answers {executed}"
    said = short(first.simulated, 120)
    return f"{where}: the trajectory says {said} but the executor answers {executed}"


def _grounded(traj: Trajectory, result: GroundingResult) -> tuple[Trajectory, int, int]:
    """A copy of ``traj`` whose tool turns are the executor's; (copy, replaced, added)."""
    pairs = call_pairs(traj)
    if len(pairs) != len(result.observations):
        raise ValueError("the result does not come from replaying this trajectory")
    out = Trajectory.from_dict(deepcopy(traj.to_dict()))
    replaced = 0
    missing: dict[int, list[int]] = {}  # assistant turn -> calls without an observation
    for k, (turn, call, answer) in enumerate(pairs):
        if answer is None:
            missing.setdefault(turn, []).append(k)
            continue
        tool_turn = out.turns[answer]
        if tool_turn.content != result.observations[k]:
            replaced += 1
        tool_turn.content = result.observations[k]
        tool_turn.name = call.name
    added = 0
    # Insert from the end so earlier turn indexes stay valid; each goes after the
    # tool turns already answering its assistant turn.
    for turn in sorted(missing, reverse=True):
        at = turn + 1
        while at < len(out.turns) and out.turns[at].role == "tool":
            at += 1
        new = [
            Turn(
                role="tool",
                content=result.observations[k],
                name=pairs[k][1].name,
                tool_call_id=pairs[k][1].id,
            )
            for k in missing[turn]
        ]
        out.turns[at:at] = new
        added += len(new)
    return out, replaced, added


def apply_mode(
    traj: Trajectory, result: GroundingResult, mode: Mode | str
) -> tuple[Trajectory | None, dict[str, Any]]:
    """Act on a replay: reject, fix or keep the trajectory.

    Args:
        traj: the trajectory :func:`replay` ran (not modified).
        result: its replay.
        mode: ``verify`` rejects a trajectory with any contradicted or missing
            observation; ``ground`` returns a copy whose every answering tool turn
            holds the executed text (and inserts the missing ones); ``off`` keeps it.

    Returns:
        ``(trajectory or None when rejected, info)``. ``info`` always holds
        ``fidelity``, ``matched``, ``total``, ``delta_size``; a rejection adds
        ``reason`` (``contradicts_executor``) and ``message``; ``ground`` adds
        ``observations_replaced`` (tool turns whose text changed) and
        ``observations_added``.

    Raises:
        ConfigError: an unknown mode.
        ValueError: ``result`` has another number of calls than ``traj``.
    """
    info = result.summary()
    if mode == "off":
        return traj, info
    if mode == "verify":
        if result.matched == result.total:
            return traj, info
        info.update(reason="contradicts_executor", message=_mismatch_message(result))
        return None, info
    if mode == "ground":
        grounded, replaced, added = _grounded(traj, result)
        info.update(observations_replaced=replaced, observations_added=added)
        return grounded, info
    raise ConfigError(
        f"unknown grounding mode {mode!r}; use one of {', '.join(MODES)}", key_path="grounding.mode"
    )
