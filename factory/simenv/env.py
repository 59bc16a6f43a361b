"""One episode of a simulated environment: ``reset(task)`` and ``step(action)`` (Simia-RL).

The agent under training sends one action per step: a message to the user
(``{"content": ...}``) or a tool call (``{"name": ..., "arguments": ...}``). A tool
call is first checked with the data pipeline's validators (``factory.core.validate``
and the domain's rules): an invalid call gets an ``Error: invalid tool call ...``
observation naming every problem, the world is not touched and the episode goes on.
A valid call is answered by the mode:

* ``executor``: the episode's own fork of the domain's world (exact);
* ``llm``: the LLM tool simulator (tools, policy, a reference trajectory, the history;
  told to explain failures);
* ``hybrid``: the world for every tool it implements, the LLM for the rest (and for
  ``simulate_tools``); an LLM answer is checked against the state: every ``*_id`` it
  (or list under a table's name) must be a row of that table, and what a read tool's
  answer says about a row must be what the row holds (``info["consistency"]``).

A message to the user is answered by the LLM user simulator driven by the task's
instruction; it ends the episode (``###STOP###``), as does ``max_steps``. At the end,
rewards: tau-bench's (the final state equals the state the ground-truth actions
produce, and every required output was said) where the domain has a world, and the
LLM judge's (0/1 and reasons) when ``judge`` is on. Given the response cache the
whole episode, rewards included, is a pure function of the actions and the seed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from factory.core.repair import parse_arguments
from factory.core.trajectory import ToolCall, Trajectory, Turn
from factory.core.validate import validate_calls
from factory.envs.base import Environment
from factory.envsim import roles
from factory.errors import ConfigError, FactoryError, LLMError, RepairError, short
from factory.simenv.llm import RoleLLM
from factory.simenv.spec import MODES, DomainSpec
from factory.simenv.tasks import Task

__all__ = ["REWARD_SOURCES", "SimEnv", "StepResult", "check_consistency", "executor_reward"]

REWARD_SOURCES = ("auto", "executor", "judge")


@dataclass
class StepResult:
    """What ``step`` returns (gymnasium's 5-tuple fields, plus who spoke)."""

    observation: dict[str, Any]
    reward: float
    done: bool
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


def _said(turns: list[dict[str, Any]]) -> str:
    text = " ".join(t.get("content") or "" for t in turns if t.get("role") == "assistant")
    return text.lower().replace(",", "")


def executor_reward(
    final: Mapping[str, Any] | None,
    expected: Mapping[str, Any] | None,
    outputs: tuple[str, ...],
    turns: list[dict[str, Any]],
) -> tuple[float, list[str]]:
    """tau-bench's reward: 1 when the final state equals the expected one and every
    required output was said (case and commas ignored, as tau-bench does); reasons."""
    reasons = []
    if final is not None and expected is not None and final != expected:
        tables = [k for k in expected if final.get(k) != expected.get(k)]
        for table in tables:
            a, b = final.get(table) or {}, expected.get(table) or {}
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            reasons.append(f"{table} differ from the expected state at {short(keys, 120)}")
    said = _said(turns)
    reasons.extend(
        f"required output {o!r} not said" for o in outputs if o.lower().replace(",", "") not in said
    )
    return (0.0 if reasons else 1.0), reasons or ["final state and outputs as expected"]


def _ids(value: Any, out: list[tuple[str, str]]) -> None:
    """``(table, id)`` of every ``<thing>_id: str`` and ``<things>: [str, ...]`` in ``value``."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, str) and k.endswith("_id"):
                out.append((k[: -len("_id")] + "s", v))
            elif isinstance(v, list) and v and all(isinstance(x, str) for x in v):
                out.extend((k, x) for x in v)
            else:
                _ids(v, out)
    elif isinstance(value, list):
        for v in value:
            _ids(v, out)


def check_consistency(
    observation: str, state: Mapping[str, Any], *, values: bool = True
) -> dict[str, Any]:
    """Whether an LLM-simulated observation agrees with the world's state.

    Domain-free, in two parts:

    * **ids**: every ``<thing>_id`` value in the (JSON) observation whose table
      ``<thing>s`` exists in the state, and every string in a ``<things>`` list, must
      be a row of that table (a simulator that invents a reservation is caught);
    * **values** (``values``, for a read tool: a simulated write's answer describes a
      change the world never made): an object naming a row by the id the row itself
      carries (``{"reservation_id": "X", ...}`` and ``reservations["X"]["reservation_id"]
      == "X"``) must agree with that row on every key both have, the drift EnvSimBench
      finds (a stale status, a wrong cabin, a price off by a fee).

    Returns ``{"checked": ids checked, "unknown": ["table/id"], "compared": values
    compared, "mismatched": ["table/id.key"], "ok": bool}``.
    """
    try:
        value = json.loads(observation)
    except ValueError:
        return {"checked": 0, "unknown": [], "compared": 0, "mismatched": [], "ok": True}
    found: list[tuple[str, str]] = []
    _ids(value, found)
    checked, unknown = 0, []
    for name, ident in found:
        table = state.get(name)
        if isinstance(table, dict):
            checked += 1
            if ident not in table:
                unknown.append(f"{name}/{ident}")
    compared, mismatched = 0, []
    if values:
        for obj, name, ident, row in _described_rows(value, state):
            for key in obj.keys() & row.keys():
                compared += 1
                if obj[key] != row[key]:
                    mismatched.append(f"{name}/{ident}.{key}")
    ok = not unknown and not mismatched
    return {
        "checked": checked,
        "unknown": unknown,
        "compared": compared,
        "mismatched": mismatched,
        "ok": ok,
    }


def _described_rows(
    value: Any, state: Mapping[str, Any]
) -> Iterator[tuple[dict[str, Any], str, str, dict[str, Any]]]:
    """``(object, table, id, row)`` for every object of ``value`` that names a row of the
    state by the id key the row itself carries."""
    if isinstance(value, dict):
        for key, ident in value.items():
            if not (isinstance(ident, str) and key.endswith("_id")):
                continue
            name = key[: -len("_id")] + "s"
            table = state.get(name)
            row = table.get(ident) if isinstance(table, dict) else None
            if isinstance(row, dict) and row.get(key) == ident:
                yield value, name, ident, row
        children: Iterable[Any] = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return
    for child in children:
        yield from _described_rows(child, state)


class SimEnv:
    """A simulated environment for one episode at a time (reuse it: ``reset`` starts over).

    Args:
        spec: the served domain (pack, base world, tasks).
        mode: ``llm``, ``executor`` or ``hybrid``.
        llm: the LLM behind the user, the tool simulator and the judge.
        judge: ask the LLM judge at the end of every episode.
        reward: which reward ``step`` returns at the end: ``executor``, ``judge`` or
            ``auto`` (the executor's when the task has ground-truth actions and the
            episode a world, else the judge's).
        simulate_tools: in ``hybrid``, tools the LLM answers although the world has them.
        max_steps: actions before the episode is cut (``truncated``).
    """

    def __init__(
        self,
        spec: DomainSpec,
        *,
        mode: str = "executor",
        llm: RoleLLM | None = None,
        judge: bool = True,
        reward: str = "auto",
        simulate_tools: frozenset[str] = frozenset(),
        max_steps: int = 60,
    ):
        if mode not in MODES:
            raise ConfigError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}", key_path="mode")
        if reward not in REWARD_SOURCES:
            raise ConfigError(f"unknown reward {reward!r}; use {REWARD_SOURCES}", key_path="reward")
        if mode != "llm" and spec.world is None:
            raise ConfigError(
                f"mode {mode!r} needs the domain's executable world; give its database "
                "(--db) or a generated world (--world-seed), or use --mode llm",
                key_path="mode",
            )
        self.spec = spec
        self.mode = mode
        self.llm = llm
        self.judge = judge
        self.reward_source = reward
        self.simulate_tools = frozenset(simulate_tools)
        self.max_steps = max_steps
        self.task: Task | None = None
        self.world: Environment | None = None
        self.turns: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []
        self.episode_id = ""
        self.seed = 0
        self.steps = 0
        self.done = True
        self.reward: float | None = None
        self.result: dict[str, Any] = {}
        self.counts: dict[str, int] = {}

    # --- the episode ----------------------------------------------------------------------
    async def reset(
        self, task: Task | str | int | None = None, *, seed: int = 0, episode_id: str | None = None
    ) -> dict[str, Any]:
        """Start an episode; returns the system prompt, the tools and the first user message.

        Raises:
            ConfigError: an unknown task.
            LLMError, BudgetExceeded: the user simulator could not speak.
        """
        self.task = self.spec.task(task, seed)
        self.seed = seed
        self.episode_id = episode_id or uuid.uuid4().hex
        self.world = self.spec.fork() if self.mode != "llm" else None
        self.turns, self.calls, self.steps, self.done = [], [], 0, False
        self.reward, self.result = None, {}
        self.counts = {"invalid_calls": 0, "tool_errors": 0, "simulated_calls": 0,
                       "inconsistent_simulations": 0}  # fmt: skip
        first, done = await self._user_says()
        self.done = done
        return {
            "role": "user",
            "content": first,
            "system": self.spec.pack.policy,
            "tools": self.spec.tools,
            "task_id": self.task.task_id,
            "episode_id": self.episode_id,
        }

    async def step(self, action: Mapping[str, Any]) -> StepResult:
        """One agent action: a tool call (``name``, ``arguments``) or a message (``content``).

        Raises:
            ConfigError: no episode is running (call ``reset``), or the action is neither.
            LLMError, BudgetExceeded: an LLM role could not answer.
        """
        if self.task is None or self.done:
            raise ConfigError("no episode is running: call reset() first", key_path="action")
        name = action.get("name") or action.get("tool_name")
        content = action.get("content") or action.get("message") or ""
        if not name and not isinstance(content, str):
            raise ConfigError("an action is {'content': str} or {'name', 'arguments'}")
        self.steps += 1
        info: dict[str, Any] = {"step": self.steps}
        if name:
            observation = await self._tool_step(str(name), action.get("arguments"), content, info)
        else:
            observation = await self._message_step(str(content), info)
        truncated = not self.done and self.steps >= self.max_steps
        if truncated:
            self.done = True
        reward = 0.0
        if self.done:
            await self._finish()
            reward = float(self.reward or 0.0)
            info["rewards"] = self.result
        return StepResult(observation, reward, self.done, truncated, info)

    async def _message_step(self, content: str, info: dict[str, Any]) -> dict[str, Any]:
        self.turns.append({"role": "assistant", "content": content})
        reply, done = await self._user_says()
        self.done = done
        info["speaker"] = "user"
        return {"role": "user", "content": reply}

    async def _tool_step(
        self, name: str, raw: Any, content: Any, info: dict[str, Any]
    ) -> dict[str, Any]:
        problems: list[str] = []
        try:
            arguments, _ = parse_arguments(raw)
        except (RepairError, ValueError, TypeError) as exc:
            arguments, problems = {}, [f"arguments are not a JSON object: {exc}"]
        call = ToolCall(name=name, arguments=arguments, id=f"call_{self.steps}")
        self.turns.append({"role": "assistant", "content": str(content or ""),
                           "tool_calls": [call.to_dict()]})  # fmt: skip
        if not problems:
            problems = self._invalid(call)
        info["speaker"] = "tool"
        if problems:
            self.counts["invalid_calls"] += 1
            info["invalid"] = problems
            observation = "Error: invalid tool call: " + "; ".join(problems)
        else:
            observation = await self._answer(call, info)
        if observation.startswith("Error"):
            self.counts["tool_errors"] += 1
        self.turns.append({"role": "tool", "name": name, "content": observation,
                           "tool_call_id": call.id})  # fmt: skip
        self.calls.append({"name": name, "arguments": arguments, "observation": observation})
        return {"role": "tool", "name": name, "content": observation}

    def _invalid(self, call: ToolCall) -> list[str]:
        """The pipeline's validators on one call: its tool's schema, then the domain's rules."""
        traj = Trajectory(
            tools=self.spec.pack.tools, turns=[Turn(role="assistant", tool_calls=[call])]
        )
        issues = validate_calls(traj)
        if not issues and self.spec.pack.rules is not None:
            issues = list(self.spec.pack.rules.check(traj))
        return [f"{i.code}: {i.message}" for i in issues]

    async def _answer(self, call: ToolCall, info: dict[str, Any]) -> str:
        world = self.world
        by_world = world is not None and call.name in world.tool_names
        if self.mode == "executor" or (by_world and call.name not in self.simulate_tools):
            assert world is not None
            info["answered_by"] = "executor"
            return world.execute(call.name, call.arguments)
        info["answered_by"] = "llm"
        self.counts["simulated_calls"] += 1
        observation = await self._simulate(call)
        if world is not None:  # hybrid: a state exists, check the answer against it
            read = self.spec.pack.kinds.get(call.name) != "write"
            check = check_consistency(observation, world.state, values=read)
            info["consistency"] = check
            if not check["ok"]:
                self.counts["inconsistent_simulations"] += 1
        return observation

    async def _simulate(self, call: ToolCall) -> str:
        assert self.task is not None
        messages = roles.tool_messages(
            tools=self.spec.tools,
            policy=self.spec.pack.policy,
            reference=self.task.reference,
            history=self.calls,
            call={"name": call.name, "arguments": call.arguments},
        )
        text = await self._llm().complete("tool", messages, **self._identity())
        try:
            return roles.parse_tool_answer(text)
        except RepairError:  # a model that answered in prose: that prose is the tool's output
            return text.strip()

    async def _user_says(self) -> tuple[str, bool]:
        assert self.task is not None
        conversation = [
            {"role": "agent" if t["role"] == "assistant" else "user", "content": t["content"]}
            for t in self.turns
            if t["role"] in ("user", "assistant") and not t.get("tool_calls")
        ]
        messages = roles.user_messages(self.task.instruction, conversation)
        text = await self._llm().complete("user", messages, **self._identity())
        reply, done = roles.parse_user_answer(text)
        self.turns.append({"role": "user", "content": reply})
        return reply, done

    def _llm(self) -> RoleLLM:
        if self.llm is None:
            raise ConfigError("this environment has no LLM for its user, tools and judge")
        return self.llm

    def _identity(self) -> dict[str, Any]:
        assert self.task is not None
        return {"task": self.task.task_id, "seed": self.seed}

    # --- rewards --------------------------------------------------------------------------
    async def _finish(self) -> None:
        assert self.task is not None
        task = self.task
        result: dict[str, Any] = {}
        expected = self.spec.expected_state(task) if self.world is not None else None
        if self.world is not None and (expected is not None or task.outputs):
            final = self.world.state if expected is not None else None
            r, why = executor_reward(final, expected, task.outputs, self.turns)
            result["executor"] = {"reward": r, "reasons": why}
        if self.judge and self.llm is not None:
            result["judge"] = await self._judge()
        source = self.reward_source
        if source == "auto":
            source = "executor" if "executor" in result else "judge"
        chosen = result.get(source)
        self.reward = float(chosen["reward"]) if chosen and chosen["reward"] is not None else 0.0
        result["source"] = source
        self.result = result

    async def _judge(self) -> dict[str, Any]:
        assert self.task is not None
        messages = roles.judge_messages(
            instruction=self.task.instruction,
            expected_actions=self.task.actions,
            outputs=self.task.outputs,
            expected_outcome=self.task.expected_outcome,
            episode=self.turns,
        )
        try:
            text = await self._llm().complete("judge", messages, **self._identity())
            reward, reasons = roles.parse_judgement(text)
        except (LLMError, RepairError) as exc:  # recorded, never a crash of the episode
            return {"reward": None, "reasons": [f"{type(exc).__name__}: {short(str(exc))}"]}
        return {"reward": reward, "reasons": reasons}

    # --- views ----------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The episode's bookkeeping (OpenEnv's ``state``): ids, counts, rewards so far."""
        return {
            "episode_id": self.episode_id,
            "task_id": self.task.task_id if self.task else None,
            "step_count": self.steps,
            "done": self.done,
            "reward": self.reward,
            "mode": self.mode,
            "counts": dict(self.counts),
            "rewards": self.result,
        }

    def trajectory(self) -> Trajectory:
        """The episode as a canonical trajectory (rollouts are data: ``factory.simenv.rollout``)."""
        if self.task is None:
            raise FactoryError("no episode yet")
        labels = {
            "mode": self.mode,
            "steps": self.steps,
            **self.counts,
            **{f"reward_{k}": v["reward"] for k, v in self.result.items() if isinstance(v, dict)},
        }
        return Trajectory(
            system=self.spec.pack.policy,
            tools=self.spec.tools,
            turns=[Turn.from_dict(t) for t in self.turns],
            metadata={
                "source": f"simenv:{self.spec.name}",
                "task_id": self.task.task_id,
                "user_id": self.task.user_id,
                "reward": self.reward,
                "labels": labels,
                "trial": self.seed,
            },
        )
