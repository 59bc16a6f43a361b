"""The library's scenarios for the factory's LLM-free sampler (the ``envsim`` job).

The walk (draw a scenario, cast a member, follow-ups, labels) is the factory's
``ScenarioSampler``; the library states its episodes: ``browse`` (a member asks about their
loans), ``borrow`` (find a title, confirm, check it out) and ``over_limit`` (a member at the
limit asks to borrow: the agent refuses, as the policy says).
"""

from __future__ import annotations

import json
import random
from typing import Any

from factory.envs.base import Environment
from factory.envs.episode import Abort, Episode, ScenarioSampler
from factory_library import LibraryWorld
from factory_library.tools import WRITE_TOOLS

__all__ = ["SAMPLER"]

SYSTEM = "You are a library assistant. Identify the member by their member id first."
State = dict[str, Any]


class _Visit(Episode):
    def wrong_calls(self, name: str, args: dict[str, Any], cost: float) -> dict[str, Any]:
        out: dict[str, Any] = {"missing_argument": {}}
        if "member_id" in args:
            out["unknown_member"] = {**args, "member_id": args["member_id"] + "9"}
        return out

    def member(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.act("get_member_details", {"member_id": self.user_id})
        )
        return found


def _browse(ep: _Visit) -> str:
    ep.user(f"Hi, I'm member {ep.user_id}. Which books do I have out?")
    loans = ep.member()["loans"]
    return f"You have {len(loans)} loan(s): {', '.join(loans) or 'none'}."


def _free_titles(state: State, member_id: str) -> list[str]:
    member = state["members"][member_id]
    return sorted(
        b["title"]
        for b in state["books"].values()
        if b["copies_available"] > 0 and f"L-{member_id}-{b['book_id']}" not in member["loans"]
    )


def _borrow(ep: _Visit) -> str:
    title = ep.rng.choice(_free_titles(ep.state, ep.user_id))
    ep.user(f"Hello, member {ep.user_id} here. I'd like to borrow {title}.")
    ep.member()
    found = json.loads(ep.act("search_books", {"title": title}))
    book = next(b for b in found if b["copies_available"] > 0)
    ep.say(f"{book['title']} by {book['author']} ({book['book_id']}) is available. Check it out?")
    ep.user("Yes, please.")
    try:
        loan = json.loads(
            ep.act("checkout_book", {"member_id": ep.user_id, "book_id": book["book_id"]})
        )
    except ValueError:
        raise Abort("I'm sorry, I could not check that book out.") from None
    return f"Done: loan {loan['loan_id']}, due back {loan['due']}."


def _over_limit(ep: _Visit) -> str:
    ep.user(f"Hi, I'm {ep.user_id}. Can I borrow one more book?")
    member = ep.member()
    return f"I'm sorry, you already have {len(member['loans'])} loans, your limit."


def _fits(state: State, scenario: str, member_id: str) -> bool:
    member = state["members"][member_id]
    at_limit = len(member["loans"]) >= member["max_loans"]
    if scenario == "borrow":
        return not at_limit and bool(_free_titles(state, member_id))
    if scenario == "over_limit":
        return at_limit
    return True


def _visit(
    env: Environment, rng: random.Random, member_id: str, shares: tuple[float, float]
) -> _Visit:
    return _Visit(env, rng, member_id, shares)


SAMPLER = ScenarioSampler(
    run={"browse": _browse, "borrow": _borrow, "over_limit": _over_limit},
    weights={"browse": 0.3, "borrow": 0.5, "over_limit": 0.2},
    followups=("browse", "borrow"),
    fits=_fits,
    episode=_visit,
    system=SYSTEM,
    default_tools=LibraryWorld.bare_tools,
    write_tools=WRITE_TOOLS,
    users="members",
)
