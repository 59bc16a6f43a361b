"""What the domains' development-server episodes share: a short scripted conversation
whose every call is executed on the prompt's scenario.

The devserver answers a grounded amplification prompt by playing a policy-shaped episode
(``factory/envs/<domain>/devserver.py``) on a copy of the scenario, so the observations
are the world's own. The message bookkeeping, the confirm/close exchange and the choice of
plot are the same for every domain and written once here; a domain gives its wording, its
plots and how a conversation opens.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from factory.envs.base import Environment

__all__ = ["ScriptedEpisode", "choose_plot", "read_tables"]

Message = dict[str, Any]
State = dict[str, Any]


def read_tables(value: Any, tables: Sequence[str]) -> State | None:
    """``value`` if it is a state with every table in ``tables`` and at least one user
    (a prompt's environment block), else None."""
    if not isinstance(value, dict) or not all(isinstance(value.get(t), dict) for t in tables):
        return None
    users = value["users"]
    if not users or not all(isinstance(u, dict) for u in users.values()):
        return None
    return value


class ScriptedEpisode:
    """Messages in the amplification output format, every call executed on ``env``.

    Subclasses set the wording (``ASK``, ``YES``, ``FAREWELL``) and add ``open``.
    """

    ASK = "Do you want me to go ahead (yes/no)?"
    YES: tuple[str, ...] = ("Yes, please.", "Yes.", "Yes, go ahead.")
    FAREWELL = "You're welcome!"

    def __init__(self, env: Environment, rng: random.Random, user_id: str) -> None:
        self.env, self.rng, self.user_id = env, rng, user_id
        self.messages: list[Message] = []

    @property
    def state(self) -> State:
        return self.env.state

    @property
    def user(self) -> dict[str, Any]:
        found: dict[str, Any] = self.state["users"][self.user_id]
        return found

    def say_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def say(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})

    def call(self, name: str, arguments: dict[str, Any], reasoning: str) -> str:
        self.messages.append(
            {
                "role": "assistant",
                "reasoning": reasoning,
                "content": "",
                "tool_calls": [{"name": name, "arguments": arguments}],
            }
        )
        observation = self.env.execute(name, arguments)
        self.messages.append({"role": "tool", "name": name, "content": observation})
        return observation

    def pick(self, options: tuple[str, ...]) -> str:
        return self.rng.choice(options)

    def confirm(self, summary: str) -> None:
        self.say(f"{summary} {self.ASK}")
        self.say_user(self.pick(self.YES))

    def close(self, text: str) -> None:
        self.say(text)
        if self.rng.random() < 0.5:
            self.say_user(self.pick(("Thanks, that's all.", "Great, thank you!", "Perfect.")))
            self.say(self.FAREWELL)


def choose_plot(
    plots: Mapping[str, str | None],
    feasible: Callable[[str], bool],
    rng: random.Random,
    reference_tools: Collection[str],
) -> str:
    """The first plot the reference asks for (by its tools) that the state allows, else a
    random feasible one (``plots``: plot -> the reference tool that asks for it)."""
    possible = [p for p in plots if feasible(p)]
    asked = [p for p, tool in plots.items() if tool in reference_tools and p in possible]
    return asked[0] if asked else rng.choice(possible)
