"""The development server answers retail prompts: amplification, grounded amplification,
judge and simulator.

The grounded episodes and the simulator run on an executable retail world. Until the
retail world is in the tree (``factory.envs.retail.RetailEnv``, from the retail branch),
these tests run on the executor of ``seeds/retail/author.py`` (tau-bench's retail
semantics on the seeds' store); with it, on the real world as well.
"""

from __future__ import annotations

import json
import random
import re
import runpy
from collections.abc import Callable, Iterator
from copy import deepcopy
from typing import Any

import pytest

from factory.config import load_recipe
from factory.core.formats import parse_record
from factory.core.formats.completion import render_output
from factory.core.validate import validate
from factory.devserver import grounded, simulate
from factory.envs.base import Environment
from factory.envs.pack import load_domain
from factory.envs.plugin import DomainPlugin
from factory.envs.registry import register_domain, reset_registry
from factory.envs.retail import devserver as retail
from factory.envsim.grounding import ENV_STATE_MARKER, render_scenario
from tests.conftest import ROOT

AUTHOR = runpy.run_path(str(ROOT / "seeds" / "retail" / "author.py"), run_name="author")
DOMAIN = load_domain(load_recipe(ROOT / "pipelines" / "retail.yaml"))
SEEDS = [
    json.loads(line)
    for line in (ROOT / "seeds" / "retail" / "seeds.jsonl").read_text().splitlines()
]


class StoreEnv:
    """An ``Environment`` over the seed author's executor (tau-bench's retail semantics)."""

    domain = "retail"

    def __init__(self, state: dict[str, Any]) -> None:
        self.store = AUTHOR["Store"]()
        self.store.users, self.store.orders, self.store.products = (
            state["users"],
            state["orders"],
            state["products"],
        )

    @property
    def state(self) -> dict[str, Any]:
        s = self.store
        return {"users": s.users, "orders": s.orders, "products": s.products}

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(DOMAIN.kinds)

    def execute(self, name: str, arguments: Any) -> str:
        try:
            return str(self.store.run(name, arguments))
        except (KeyError, TypeError) as exc:
            return f"Error: {exc}"

    def copy(self) -> Environment:
        return StoreEnv(deepcopy(self.state))


def _worlds() -> list[Callable[[dict[str, Any]], Environment]]:
    worlds: list[Callable[[dict[str, Any]], Environment]] = [StoreEnv]
    try:  # the retail branch's executable world, once merged
        from factory.envs.retail import RetailEnv  # type: ignore[attr-defined]
    except ImportError:
        return worlds
    return [*worlds, lambda state: RetailEnv(state)]


@pytest.fixture(params=_worlds(), ids=lambda w: getattr(w, "__name__", "RetailEnv"))
def world(request: pytest.FixtureRequest) -> Callable[[dict[str, Any]], Environment]:
    return request.param  # type: ignore[no-any-return]


def scenario(user_id: str) -> dict[str, Any]:
    """The slice a grounded prompt shows: one user, their orders, the products in them."""
    store = AUTHOR["Store"]()
    user = store.users[user_id]
    orders = {o: store.orders[o] for o in user["orders"]}
    products = {
        i["product_id"]: store.products[i["product_id"]]
        for o in orders.values()
        for i in o["items"]
    }
    return deepcopy({"users": {user_id: user}, "orders": orders, "products": products})


def check_valid(messages: list[dict[str, Any]]) -> None:
    """The answer is a valid retail trajectory: the pack's schemas and filters/retail.yaml."""
    record = {"messages": messages, "tools": DOMAIN.public_tools(), "system": DOMAIN.policy}
    traj = parse_record(record, source="devserver")
    assert validate(traj, rules=DOMAIN.rules) == []


def calls(messages: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], str]]:
    for i, m in enumerate(messages):
        for call in m.get("tool_calls") or []:
            yield call["name"], call["arguments"], messages[i + 1]["content"]


# --- ungrounded amplification and judge: domain-free, on retail references -----------------
def reference(seed: dict[str, Any]) -> dict[str, Any]:
    """The seed as an amplification prompt shows it (the output format)."""
    rendered: dict[str, Any] = render_output(parse_record(seed, source="seed"))
    return rendered


@pytest.mark.parametrize("index", range(0, 35, 3))
def test_amplifying_a_retail_seed_keeps_the_id_formats(index: int) -> None:
    ref = reference(SEEDS[index])
    answer = simulate.amplify(ref, random.Random(index))
    check_valid(answer["messages"])  # order ids keep '#W' and seven digits, and so on
    before = {a.get("order_id") for _n, a, _o in calls(ref["messages"])} - {None}
    after = {a.get("order_id") for _n, a, _o in calls(answer["messages"])} - {None}
    assert len(after) == len(before) and not before & after  # renamed, one for one
    assert all(re.fullmatch(r"#W\d{7}", o) for o in after)


def test_the_judge_keeps_every_retail_seed() -> None:
    for seed in SEEDS:
        assert simulate.judge(reference(seed))["keep"] is True


# --- grounded amplification ----------------------------------------------------------------
def test_read_state_knows_a_retail_state_only() -> None:
    state = scenario("mia_ortiz_4821")
    assert retail.read_state(state) is state
    airline_like = {"users": state["users"], "flights": {}, "reservations": {}}
    assert retail.read_state(airline_like) is None
    assert retail.read_state({**state, "users": {}}) is None


@pytest.mark.parametrize(
    ("user_id", "plot"),
    [
        ("mia_ortiz_4821", "cancel"),
        ("mia_ortiz_4821", "modify_items"),
        ("mia_ortiz_4821", "order_address"),
        ("liam_chen_5518", "payment"),
        ("liam_chen_5518", "return"),
        ("ava_patel_6634", "exchange"),
        ("noah_kim_7305", "user_address"),
        ("ethan_brooks_1042", "status"),
        ("sofia_reyes_2290", "profile"),
    ],
)
def test_grounded_episode_is_executed_on_the_scenario(
    world: Callable[[dict[str, Any]], Environment], user_id: str, plot: str
) -> None:
    state = scenario(user_id)
    before = deepcopy(state)
    tool = retail.PLOTS[plot]
    answer = retail.grounded_trajectory(
        state, random.Random(1), world=world, reference_tools=[tool] if tool else []
    )
    assert answer is not None and state == before  # the scenario is not modified
    messages = answer["messages"]
    check_valid(messages)
    played = [name for name, _a, _o in calls(messages)]
    assert played[:2] == ["find_user_id_by_email", "get_user_details"]
    if tool is not None:
        assert tool in played
    replay = world(deepcopy(before))  # every observation is what the world answers
    for name, arguments, observation in calls(messages):
        assert replay.execute(name, arguments) == observation, name
        assert not observation.startswith("Error"), (name, observation)
    writes = [n for n in played if DOMAIN.kinds[n] == "write"]
    for i, m in enumerate(messages):  # a yes from the user right before every write
        for call in m.get("tool_calls") or []:
            if call["name"] in writes:
                assert messages[i - 1]["role"] == "user" and "Yes" in messages[i - 1]["content"]


def test_a_state_that_cannot_be_played_gets_none(
    world: Callable[[dict[str, Any]], Environment],
) -> None:
    state = scenario("mia_ortiz_4821")
    state["users"]["mia_ortiz_4821"].pop("email")
    assert retail.grounded_trajectory(state, random.Random(0), world=world) is None


@pytest.fixture()
def retail_plugin(world: Callable[[dict[str, Any]], Environment]) -> Iterator[None]:
    """Retail registered with a world and the devserver hooks, as its plug-in wires them."""

    def environment(**kw: Any) -> Environment:
        if "state" not in kw:
            raise NotImplementedError("this test world is built from a state only")
        if retail.read_state(kw["state"]) is None:
            from factory.errors import ConfigError

            raise ConfigError("not a retail state")
        return world(kw["state"])

    def clear() -> None:
        grounded._hooks.cache_clear()
        grounded._enums.cache_clear()
        simulate._vocabulary.cache_clear()

    register_domain(
        DomainPlugin("retail", environment=environment, devserver=retail.devserver_hooks(world)),
        replace=True,
    )
    clear()
    yield
    reset_registry()
    clear()


def test_the_devserver_answers_a_grounded_retail_prompt(retail_plugin: None) -> None:
    state = scenario("sofia_reyes_2290")
    ref = reference(SEEDS[0])
    text = (
        f"{ENV_STATE_MARKER}\n```json\n{render_scenario(state)}\n```\n\n"
        f"{simulate.AMPLIFY_MARKER}\n```json\n{json.dumps(ref)}\n```\n"
    )
    shown = grounded.read_scenario(text)
    assert shown == state
    answer = grounded.grounded_trajectory(
        shown, random.Random(2), reference_tools=["cancel_pending_order"]
    )
    assert answer is not None
    check_valid(answer["messages"])
    assert "cancel_pending_order" in [n for n, _a, _o in calls(answer["messages"])]
    assert grounded.corrupt_observation(answer, random.Random(0))  # retail enums drift too


def test_the_devserver_simulates_a_retail_call_perfectly(retail_plugin: None) -> None:
    state = scenario("mia_ortiz_4821")
    answer = simulate.simulate_call(
        state, "cancel_pending_order", {"order_id": "#W2378156", "reason": "no longer needed"}
    )
    assert answer is not None
    assert json.loads(answer["feedback"])["status"] == "cancelled"
    paths = {c["path"] for c in answer["config_changes"]}
    assert "/orders/#W2378156/status" in paths
    refused = simulate.simulate_call(
        state, "cancel_pending_order", {"order_id": "#W5193047", "reason": "no longer needed"}
    )
    assert refused == {
        "feedback": "Error: non-pending order cannot be cancelled",
        "config_changes": [],
    }
