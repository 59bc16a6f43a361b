"""The development server answers retail prompts: amplification, grounded amplification,
judge and simulator, with no retail code of its own (``factory.devserver.oracle``).

The grounded answers replay a retail seed's plot and the simulator executes calls, on an
executable retail world: the executor of ``seeds/retail/author.py`` (tau-bench's retail
semantics on the seeds' store, registered as the retail world by ``retail_plugin``) and
the real world (``factory.envs.retail.RetailEnv``).
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

from factory.core.formats import parse_record
from factory.core.formats.completion import render_output
from factory.core.validate import validate
from factory.devserver import grounded, simulate
from factory.devserver.simulate import extract_block
from factory.envs.base import Environment
from factory.envs.pack import load_domain
from factory.envs.plugin import DomainPlugin
from factory.envs.registry import register_domain, reset_registry
from factory.envsim.grounding import ENV_STATE_MARKER, render_scenario
from factory.recipe import load_recipe
from tests.conftest import ROOT

AUTHOR = runpy.run_path(str(ROOT / "seeds" / "retail" / "author.py"), run_name="author")
DOMAIN = load_domain(load_recipe(ROOT / "pipelines" / "retail.yaml").domain)
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
PLOTS = {
    "cancel": "cancel_pending_order",
    "modify_items": "modify_pending_order_items",
    "order_address": "modify_pending_order_address",
    "payment": "modify_pending_order_payment",
    "return": "return_delivered_order_items",
    "exchange": "exchange_delivered_order_items",
    "user_address": "modify_user_address",
    "status": "get_order_details",
    "profile": "get_user_details",
}


def seed_calling(tool: str) -> dict[str, Any]:
    """The first seed whose agent calls ``tool`` and the store accepts it."""
    for seed in SEEDS:
        for name, _a, observation in calls(reference(seed)["messages"]):
            if name == tool and not observation.startswith("Error"):
                return seed
    raise AssertionError(f"no seed calls {tool}")


@pytest.fixture()
def retail_plugin(world: Callable[[dict[str, Any]], Environment]) -> Iterator[None]:
    """Retail registered with ``world`` as its environment (and its real pack)."""
    from factory.devserver import domains
    from factory.envs.registry import get_plugin

    def environment(**kw: Any) -> Environment:
        if "state" not in kw:
            raise NotImplementedError("this test world is built from a state only")
        if set(kw["state"]) != {"users", "orders", "products"}:
            from factory.errors import ConfigError

            raise ConfigError("not a retail state")
        return world(kw["state"])

    pack = get_plugin("retail").pack
    register_domain(DomainPlugin("retail", pack=pack, environment=environment), replace=True)
    domains.reset()
    yield
    reset_registry()
    domains.reset()


def test_a_retail_state_is_read_as_retail() -> None:
    from factory.devserver import domains

    state = scenario("mia_ortiz_4821")
    found = domains.world_over(state)
    assert found is not None and found[0] == "retail"
    airline_like = {"users": state["users"], "flights": {}, "reservations": {}}
    other = domains.world_over(airline_like)
    assert other is None or other[0] != "retail"
    assert grounded.read_scenario(_prompt({**state, "users": {}}, SEEDS[0])) is None


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
    retail_plugin: None, world: Callable[[dict[str, Any]], Environment], user_id: str, plot: str
) -> None:
    state = scenario(user_id)
    before = deepcopy(state)
    tool = PLOTS[plot]
    ref = reference(seed_calling(tool))
    answer = grounded.grounded_trajectory(
        state, simulate.reference_messages(simulate.compile_reference(ref)), random.Random(1)
    )
    assert answer is not None and state == before  # the scenario is not modified
    messages = answer["messages"]
    check_valid(messages)
    played = [name for name, _a, _o in calls(messages)]
    first = [name for name, _a, _o in calls(ref["messages"])][:2]
    assert played[:2] == first  # the user is identified as the reference identifies them
    assert tool in played  # this user's state allows the reference's plot
    replay = world(deepcopy(before))  # every observation is what the world answers
    for name, arguments, observation in calls(messages):
        assert replay.execute(name, arguments) == observation, name
        assert not observation.startswith("Error"), (name, observation)
    writes = [n for n in played if DOMAIN.kinds[n] == "write"]
    for i, m in enumerate(messages):  # a yes from the user right before every write
        for call in m.get("tool_calls") or []:
            if call["name"] in writes:
                assert messages[i - 1]["role"] == "user" and "Yes" in messages[i - 1]["content"]


def _prompt(state: dict[str, Any], seed: dict[str, Any]) -> str:
    return (
        f"{ENV_STATE_MARKER}\n```json\n{render_scenario(state)}\n```\n\n"
        f"{simulate.AMPLIFY_MARKER}\n```json\n{json.dumps(reference(seed))}\n```\n"
    )


def test_the_devserver_answers_a_grounded_retail_prompt(retail_plugin: None) -> None:
    state = scenario("mia_ortiz_4821")
    text = _prompt(state, seed_calling("cancel_pending_order"))
    shown = grounded.read_scenario(text)
    assert shown == state
    block = extract_block(text, simulate.AMPLIFY_MARKER)
    assert block is not None
    compiled = simulate.reference_from_block(block)
    assert compiled is not None
    answer = grounded.grounded_trajectory(
        shown, simulate.reference_messages(compiled), random.Random(2)
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
