"""What every episode of one served domain shares: its pack, its base world, its tasks.

Built once per server (or per Ray actor) and read by every episode: the tools,
policy and rules of the domain's pack, the pristine world each episode forks (a
copy-on-write fork costs microseconds, ``factory.envs.airline``), the tasks, and
the state each task's ground-truth actions produce (computed once per task, for
the executor reward).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from factory.core.labels import is_error_observation
from factory.envs.base import Environment
from factory.envs.pack import Domain, domain_from_pack
from factory.envs.registry import get_plugin
from factory.errors import ConfigError
from factory.simenv.tasks import Task

__all__ = ["MODES", "DomainSpec"]

#: How tool calls are answered: an LLM, the executable world, or the world where it can.
MODES = ("llm", "executor", "hybrid")


class DomainSpec:
    """A domain ready to serve episodes.

    Args:
        domain: the plug-in's name (``factory.domains``).
        tasks: the tasks episodes draw from.
        world: the base world (forked per episode), or None for a domain without one.
    """

    def __init__(self, domain: str, tasks: Sequence[Task], world: Environment | None = None):
        if not tasks:
            raise ConfigError("a simulated environment needs at least one task", key_path="tasks")
        self.name = domain
        self.pack = self.pack_of(domain)
        self.tools = self.pack.public_tools()
        self.world = world
        self.tasks = list(tasks)
        self._by_id = {t.task_id: t for t in self.tasks}
        self._expected: dict[str, Any] = {}
        self._lock = threading.Lock()

    @staticmethod
    def pack_of(domain: str) -> Domain:
        """The domain plug-in's pack: tools, policy, rules and which tools write."""
        plugin = get_plugin(domain, needs="pack")
        assert plugin.pack is not None
        return domain_from_pack(domain, plugin.pack)

    @classmethod
    def load(
        cls,
        domain: str,
        *,
        tasks: Sequence[Task],
        db: str | Path | None = None,
        world_seed: int | None = None,
    ) -> DomainSpec:
        """A spec whose world is the plug-in's: a tau-bench folder ``db``, else a generated
        world (``world_seed``), else none when the domain has no executable world."""
        plugin = get_plugin(domain)
        world = None
        if plugin.environment is not None and (db is not None or world_seed is not None):
            world = (
                plugin.environment(db_dir=db) if db is not None
                else plugin.environment(seed=world_seed)
            )  # fmt: skip
        return cls(domain, tasks, world)

    def task(self, which: Task | str | int | None, seed: int) -> Task:
        """The task an episode plays: given, by id, by index, or drawn by ``seed``.

        Raises:
            ConfigError: an unknown id or an index out of range.
        """
        if isinstance(which, Task):
            return which
        if which is None:
            return self.tasks[seed % len(self.tasks)]
        if isinstance(which, int) and not isinstance(which, bool):
            if not 0 <= which < len(self.tasks):
                raise ConfigError(f"task index {which} is not in 0..{len(self.tasks) - 1}")
            return self.tasks[which]
        task = self._by_id.get(str(which))
        if task is None:
            raise ConfigError(f"no task {which!r} (ids like {self.tasks[0].task_id!r})")
        return task

    def fork(self) -> Environment | None:
        """A fresh world for one episode (None when the domain has none)."""
        return None if self.world is None else self.world.copy()

    def expected_state(self, task: Task) -> dict[str, Any] | None:
        """The state the task's ground-truth actions produce on the base world (cached).

        None when there is no world or no action, and for a task derived from a seed
        whose calls fail on this world: they were made in the seed's world (its users,
        its orders), so replaying them here says nothing about success, and the judge
        rewards instead. A task file's ground truth is replayed as tau-bench does, a
        failing action included (19 of tau-bench's 500 retail training tasks have one).
        """
        if self.world is None or not task.actions:
            return None
        with self._lock:
            if task.task_id not in self._expected:
                env = self.world.copy()
                failed = [
                    is_error_observation(env.execute(action["name"], action["arguments"]))
                    for action in task.actions
                ]
                reachable = task.origin != "seed" or not any(failed)
                self._expected[task.task_id] = env.state if reachable else None
            expected = self._expected[task.task_id]
            return None if expected is None else dict(expected)
