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
(:func:`factory.simulator.feedback_match`): as JSON values with their types
(``1``, ``1.0`` and ``true`` differ) when both sides parse, else as stripped
text. Calls are paired with the tool turns that answer them by the rule of
:func:`factory.labels.call_observations` (ids when both carry one, else order).

Everything here is pure (no Ray, no LLM); the stages call it per row.
"""

from __future__ import annotations

import inspect
import json
import random
from collections.abc import Mapping
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from factory.delta import diff, same_json
from factory.envs.base import Environment
from factory.errors import ConfigError, short
from factory.simulator import feedback_match
from factory.trajectory import ToolCall, Trajectory, Turn

__all__ = [
    "BOOKING_WINDOW",
    "ENV_STATE_MARKER",
    "MODES",
    "CallCheck",
    "GroundingResult",
    "GroundingWorld",
    "apply_mode",
    "changed_size",
    "render_scenario",
    "replay",
    "scenario_user_id",
]

#: The heading of the scenario block in a grounded amplification prompt (the devserver reads it).
ENV_STATE_MARKER = "### Environment state"
MODES: tuple[str, ...] = ("verify", "ground", "off")
Mode = Literal["verify", "ground", "off"]

#: Dates (inclusive, ISO) on which a scenario offers bookable flights: after the domain's
#: "now" (2024-05-15) and inside the generated worlds' 30 days of May.
BOOKING_WINDOW: tuple[str, str] = ("2024-05-16", "2024-05-30")
MAX_RESERVATIONS = 2  # of the user's reservations shown: keeps a scenario to a few KB
OFFERED_ROUTES = 2  # bookable direct routes shown, each on one date of BOOKING_WINDOW
SHOWN_CHARS = 600  # observations kept in a CallCheck (the full texts stay in the result)


# --- the world and its scenarios ------------------------------------------------------------


def _trim_dates(flight: dict[str, Any], dates: set[str]) -> dict[str, Any]:
    out = {k: deepcopy(v) for k, v in flight.items() if k != "dates"}
    out["dates"] = {d: deepcopy(v) for d, v in flight.get("dates", {}).items() if d in dates}
    return out


def _bookable(on_date: Any) -> bool:
    if not isinstance(on_date, dict) or on_date.get("status") != "available":
        return False
    seats = on_date.get("available_seats")
    return isinstance(seats, dict) and any(isinstance(n, int) and n > 0 for n in seats.values())


class GroundingWorld:
    """One executable world, built once per actor, that prompts are grounded in.

    Args:
        domain: only ``airline`` has scenarios today.
        world_seed: seed of ``generate_world`` (ignored with ``db_dir``).
        sizes: ``generate_world`` sizes (``n_users``, ``n_flights``, ``n_reservations``,
            ``first_date``, ``n_days``); ``None`` means tau-bench's sizes.
        db_dir: a tau-bench database folder to use instead of a generated world.
        validate_arguments: passed to the environment (wrong-typed calls become errors).

    Raises:
        ConfigError: an unknown domain, a bad or unknown size, an unreadable
            ``db_dir``, or a world without users.
    """

    def __init__(
        self,
        domain: str = "airline",
        world_seed: int = 0,
        sizes: Mapping[str, Any] | None = None,
        *,
        db_dir: str | Path | None = None,
        validate_arguments: bool = True,
    ):
        if domain != "airline":
            raise ConfigError(
                f"no grounding scenarios for domain {domain!r}; available: airline",
                key_path="domain",
            )
        from factory.envs.airline import AirlineEnv
        from factory.envs.airline.world import generate_world
        from factory.sampler import world_env_id

        known = set(inspect.signature(generate_world).parameters) - {"seed"}
        unknown = sorted(set(sizes or {}) - known)
        if unknown:
            raise ConfigError(
                f"unknown world size(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
                key_path="world_sizes",
            )
        self.domain = domain
        if db_dir is not None:
            self.env: Environment = AirlineEnv.from_dir(
                db_dir, validate_arguments=validate_arguments
            )
            self.env_id = f"airline-db-{Path(db_dir).name}"
        else:
            try:
                self.env = AirlineEnv.create(
                    seed=world_seed, validate_arguments=validate_arguments, **dict(sizes or {})
                )
            except ValueError as exc:  # generate_world's size checks
                raise ConfigError(str(exc), key_path="world_sizes") from exc
            self.env_id = world_env_id(world_seed, sizes)
        state = self.env.state
        if not state["users"]:
            raise ConfigError("the grounding world has no users", key_path="world_sizes")
        with_reservations = [
            uid
            for uid, user in state["users"].items()
            if any(r in state["reservations"] for r in user.get("reservations", []))
        ]
        # Users with something to talk about first; a world without reservations still works.
        self._users = sorted(with_reservations) or sorted(state["users"])
        self._by_route: dict[tuple[str, str], list[str]] = {}
        for number, flight in state["flights"].items():
            self._by_route.setdefault((flight["origin"], flight["destination"]), []).append(number)
        low, high = BOOKING_WINDOW
        self._dates: dict[tuple[str, str], list[str]] = {}
        for route, numbers in self._by_route.items():
            dates = {
                d
                for n in numbers
                for d, on_date in state["flights"][n].get("dates", {}).items()
                if low <= d <= high and _bookable(on_date)
            }
            if dates:
                self._dates[route] = sorted(dates)
        self._routes = sorted(self._dates)

    def scenario(self, index: int, rng_seed: int) -> dict[str, Any]:
        """The state slice shown in the prompt of call ``index`` (same arguments, same slice).

        One user, up to :data:`MAX_RESERVATIONS` of their reservations, the flights of
        those reservations on their dates, and :data:`OFFERED_ROUTES` direct routes the
        user could book (preferably from their reservations' origins), each on one date
        of :data:`BOOKING_WINDOW` with free seats. For every (route, date) the slice
        holds, it holds every flight of that route flying that date, so
        ``search_direct_flight`` answers on the slice exactly as on the full world
        for any route and date it lists.

        Returns:
            An airline state ``{"users", "flights", "reservations"}`` (deep copies,
            flights in the world's order); an ``AirlineEnv`` can run on it.
        """
        state = self.env.state
        rng = random.Random(f"grounding:{rng_seed}:{index}")
        user_id = rng.choice(self._users)
        user = state["users"][user_id]
        rids = [r for r in user.get("reservations", []) if r in state["reservations"]]
        if len(rids) > MAX_RESERVATIONS:
            chosen = set(rng.sample(rids, MAX_RESERVATIONS))
            rids = [r for r in rids if r in chosen]
        reservations = {rid: state["reservations"][rid] for rid in rids}
        wanted: dict[str, set[str]] = {}
        for reservation in reservations.values():
            for leg in reservation.get("flights", []):
                if leg.get("flight_number") in state["flights"]:
                    wanted.setdefault(leg["flight_number"], set()).add(leg.get("date"))
        pairs = {
            ((state["flights"][n]["origin"], state["flights"][n]["destination"]), d)
            for n, dates in wanted.items()
            for d in dates
        }
        for route in self._offered_routes(rng, {r.get("origin") for r in reservations.values()}):
            pairs.add((route, rng.choice(self._dates[route])))
        # Close over (route, date): every flight of a listed route on a listed date is in,
        # so a direct search answers on the slice exactly as on the world. Where no flight
        # of the route is available that day (past dates), a search finds nothing on
        # either side, so those pairs need no closing.
        for route, day in pairs:
            numbers = self._by_route.get(route, [])
            flights = [(n, state["flights"][n].get("dates", {})) for n in numbers]
            if any(
                day in dates and dates[day].get("status") == "available" for _, dates in flights
            ):
                for number, dates in flights:
                    if day in dates:
                        wanted.setdefault(number, set()).add(day)
        return {
            "users": {user_id: deepcopy(user)},
            "flights": {
                number: _trim_dates(flight, wanted[number])
                for number, flight in state["flights"].items()
                if number in wanted
            },
            "reservations": deepcopy(reservations),
        }

    def _offered_routes(self, rng: random.Random, origins: set[Any]) -> list[tuple[str, str]]:
        near = [r for r in self._routes if r[0] in origins]
        far = [r for r in self._routes if r[0] not in origins]
        want = min(len(self._routes), OFFERED_ROUTES)
        picked = rng.sample(near, min(len(near), want))
        picked += rng.sample(far, want - len(picked))
        return sorted(picked)

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
            problem = self._mismatch(scenario)
            if problem:
                raise ConfigError(
                    f"the scenario does not come from this world ({problem}); build the "
                    "GroundingWorld with the domain, seed and sizes the prompts used",
                    key_path="world_seed",
                )
        return self.env.copy()

    def _mismatch(self, scenario: Mapping[str, Any]) -> str | None:
        state = self.env.state
        for table in ("users", "reservations"):
            for key, value in (scenario.get(table) or {}).items():
                if not same_json(state[table].get(key), value):
                    return f"{table[:-1]} {short(key, 40)} differs"
        for number, flight in (scenario.get("flights") or {}).items():
            full = state["flights"].get(number)
            if full is None or not same_json(
                _trim_dates(full, set(flight.get("dates", {}))), flight
            ):
                return f"flight {short(number, 40)} differs"
        return None


def scenario_user_id(scenario: Mapping[str, Any]) -> str | None:
    """The user a scenario is about (``None`` for a scenario without users)."""
    return next(iter(scenario.get("users") or {}), None)


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
    (see :func:`changed_size`).
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


def _pairs(traj: Trajectory) -> list[tuple[int, ToolCall, int | None]]:
    """(assistant turn, call, answering tool turn or None), by the rule of ``call_observations``."""
    pairs: list[tuple[int, ToolCall, int | None]] = []
    pending: list[int] = []
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


def changed_size(before: Mapping[str, Any], after: Mapping[str, Any]) -> int:
    """Exact |Δ| (``len(diff(before, after))``) between two forks of one world, cheaply.

    Entries of the top-level tables that are the same object in both forks
    cannot differ (a fork copies an object before writing it; see
    ``AirlineEnv``), so only the entries that are not are diffed. The op
    count equals that of diffing the whole states, since ``diff`` emits
    nothing for identical subtrees; for environments that do not share
    objects every entry is diffed, which is slower but still exact.
    """
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    for key in [*before, *(k for k in after if k not in before)]:
        a, b = before.get(key), after.get(key)
        if key in before and key in after and a is b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys = [k for k in b if k not in a or a[k] is not b[k]] + [k for k in a if k not in b]
            old[key] = {k: a[k] for k in keys if k in a}
            new[key] = {k: b[k] for k in keys if k in b}
            continue
        if key in before:
            old[key] = a
        if key in after:
            new[key] = b
    return len(diff(old, new))


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
    pairs = _pairs(traj)
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
    pairs = _pairs(traj)
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
