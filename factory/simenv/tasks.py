"""Tasks of a simulated environment: tau-bench task files, or derived from seed trajectories.

A task is what one episode is about: the user's instruction (drives the user
simulator), and what success means: ground-truth ``actions`` (tau-bench's
``{"name", "kwargs"}``, replayed for the executor reward and shown to the judge),
``outputs`` the agent must tell the user, or, for a task derived from a seed, an
``expected_outcome`` in prose. Tau-bench files hold tasks in ``info.task`` of each
record (``gpt-4o-airline.json``) or as bare task objects; both are read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from factory.core.trajectory import Trajectory
from factory.envsim.roles import derive_messages, parse_derived
from factory.errors import BudgetExceeded, ConfigError, FactoryError, short
from factory.io.readers import SeedReject, read_seeds

__all__ = [
    "DerivedTasks",
    "Task",
    "derive_task",
    "load_tasks",
    "task_from_record",
    "tasks_from_seeds",
]


@dataclass(frozen=True)
class Task:
    """One episode's goal.

    Attributes:
        task_id: stable id (the file's ``task_id`` or index, or the seed's id).
        instruction: the user's instruction.
        actions: ``{"name", "arguments"}`` of the ground truth, in order (may be empty).
        outputs: strings the agent must say.
        expected_outcome: prose success criterion (tasks derived from seeds).
        user_id: who the task is about, when known.
        reference: chat messages of a seed trajectory (shown to the LLM tool simulator).
        origin: ``"file"`` (a task file's ground truth) or ``"seed"`` (derived from a
            seed trajectory, whose calls were made in the seed's world, not the served one).
    """

    task_id: str
    instruction: str
    actions: tuple[dict[str, Any], ...] = ()
    outputs: tuple[str, ...] = ()
    expected_outcome: str = ""
    user_id: str | None = None
    reference: tuple[dict[str, Any], ...] = field(default=(), compare=False)
    origin: str = "file"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "reference"}


def task_from_record(record: Mapping[str, Any], index: int) -> Task:
    """A task from one tau-bench record (``info.task`` inside) or bare task object.

    Raises:
        ConfigError: no instruction, or actions that are not ``{"name", "kwargs"}`` objects.
    """
    info = record.get("info")
    raw = info.get("task") if isinstance(info, dict) and "task" in info else record
    if not isinstance(raw, dict) or not isinstance(raw.get("instruction"), str):
        raise ConfigError(f"task #{index} has no instruction", key_path=f"tasks[{index}]")
    actions = []
    for n, action in enumerate(raw.get("actions") or ()):
        if not isinstance(action, dict) or not isinstance(action.get("name"), str):
            raise ConfigError(
                f"task #{index} action #{n} is not a {{name, kwargs}} object: {short(action, 80)}",
                key_path=f"tasks[{index}].actions[{n}]",
            )
        arguments = action.get("kwargs", action.get("arguments")) or {}
        actions.append({"name": action["name"], "arguments": arguments})
    task_id = record.get("task_id", raw.get("task_id", index))
    reference = _canonical(record["traj"]) if isinstance(record.get("traj"), list) else ()
    return Task(
        task_id=str(task_id),
        instruction=raw["instruction"],
        actions=tuple(actions),
        outputs=tuple(str(o) for o in raw.get("outputs") or ()),
        user_id=raw.get("user_id"),
        reference=reference,
    )


def _canonical(messages: list[Any]) -> tuple[dict[str, Any], ...]:
    """OpenAI chat messages as canonical turns (calls as ``{"name", "arguments"}`` objects)."""
    out = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") == "system":
            continue
        turn: dict[str, Any] = {"role": m.get("role"), "content": m.get("content") or ""}
        calls = []
        for c in m.get("tool_calls") or ():
            fn = c.get("function", c) if isinstance(c, dict) else {}
            raw = fn.get("arguments")
            try:
                arguments = json.loads(raw) if isinstance(raw, str) else raw or {}
            except ValueError:
                arguments = raw
            calls.append({"name": fn.get("name"), "arguments": arguments})
        if calls:
            turn["tool_calls"] = calls
        if m.get("role") == "tool":
            turn["name"] = m.get("name")
        out.append(turn)
    return tuple(out)


def load_tasks(path: str | Path) -> list[Task]:
    """Every task of a tau-bench-style JSON file (a list), in file order; duplicates of a
    ``task_id`` keep the first.

    Raises:
        ConfigError: the file is unreadable, not a JSON list, or a task is malformed.
    """
    file = Path(path)
    try:
        records = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"cannot read task file {file}: {exc.strerror}", key_path="tasks"
        ) from exc
    except ValueError as exc:
        raise ConfigError(f"task file {file} is not JSON: {exc}", key_path="tasks") from exc
    if not isinstance(records, list):
        raise ConfigError(f"task file {file} must hold a JSON list", key_path="tasks")
    seen: dict[str, Task] = {}
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise ConfigError(f"task #{i} of {file} is not an object", key_path=f"tasks[{i}]")
        task = task_from_record(record, i)
        seen.setdefault(task.task_id, task)
    return list(seen.values())


def _seed_messages(traj: Trajectory) -> list[dict[str, Any]]:
    return [t.to_dict() for t in traj.turns]


async def derive_task(traj: Trajectory, llm: Any, *, write_tools: Iterable[str] = ()) -> Task:
    """A task from a seed trajectory: the LLM writes the instruction and expected outcome.

    The seed's calls of ``write_tools`` become the task's ``actions`` (the ground truth
    the judge sees); the answer is cached like every role answer, so deriving again costs
    nothing.

    Raises:
        LLMError, BudgetExceeded: from the LLM.
        RepairError: the answer holds no instruction.
    """
    messages = _seed_messages(traj)
    text = await llm.complete("derive", derive_messages(messages), seed_id=traj.id)
    instruction, outcome = parse_derived(text)
    writes = set(write_tools)
    actions = tuple(
        {"name": c.name, "arguments": c.arguments} for _, c in traj.calls() if c.name in writes
    )
    return Task(
        task_id=f"seed-{traj.id}",
        instruction=instruction,
        actions=actions,
        expected_outcome=outcome,
        user_id=traj.metadata.get("user_id"),
        reference=tuple(messages),
        origin="seed",
    )


@dataclass
class DerivedTasks:
    """What deriving tasks from a seed file gave: the tasks and every seed that gave none.

    Attributes:
        tasks: one task per good seed, in file order.
        rejected: ``(source, reason)`` of each seed record that is not a trajectory, or
            repeats an earlier one (``duplicate of <source>``).
        failed: ``(seed id, error)`` of each seed whose derivation failed after the
            LLM's retries (or whose answer held no instruction).
    """

    tasks: list[Task]
    rejected: list[tuple[str, str]]
    failed: list[tuple[str, str]]


async def tasks_from_seeds(
    seeds: str | Path | Iterable[str | Path],
    llm: Any,
    *,
    default_tools: list[dict[str, Any]] | None = None,
    write_tools: Iterable[str] = (),
) -> DerivedTasks:
    """Tasks derived from every seed of a file, folder or glob (``derive_task``, all at once).

    Every record is accounted for: a malformed record is in ``rejected`` with its reason,
    a derivation that failed is in ``failed``; neither stops the others. The LLM's own
    concurrency limit paces the calls, and cached answers cost nothing.

    Raises:
        ConfigError: ``seeds`` matches no file.
        BudgetExceeded: a budget cap was reached (a spent budget is not one seed's fault).
    """
    trajs: dict[str, Trajectory] = {}
    rejected: list[tuple[str, str]] = []
    for item in read_seeds(seeds, default_tools=default_tools):
        if isinstance(item, SeedReject):
            rejected.append((f"{item.source}:{item.index}", f"{item.reason}: {item.message}"))
        elif item.id in trajs:  # the same trajectory again: one task, the copy is named
            first = trajs[item.id].metadata.get("source", item.id)
            rejected.append((str(item.metadata.get("source", item.id)), f"duplicate of {first}"))
        else:
            trajs[item.id] = item
    writes = list(write_tools)
    results = await asyncio.gather(
        *(derive_task(t, llm, write_tools=writes) for t in trajs.values()),
        return_exceptions=True,
    )
    tasks: list[Task] = []
    failed: list[tuple[str, str]] = []
    for seed_id, result in zip(trajs, results, strict=True):
        if isinstance(result, BudgetExceeded):
            raise result
        if isinstance(result, FactoryError):
            failed.append((seed_id, f"{type(result).__name__}: {result}"))
        elif isinstance(result, BaseException):
            raise result
        else:
            tasks.append(result)
    return DerivedTasks(tasks, rejected, failed)


def iter_task_dicts(tasks: Iterable[Task]) -> Iterator[dict[str, Any]]:
    """Tasks as JSON objects (for manifests and ``/tasks`` listings)."""
    for task in tasks:
        yield task.to_dict()
