"""The retail world: tau-bench's replays, and the calls the replays never make.

The replays (``../shared/data/taubench-retail/replays-train.json``) only hold
ground-truth writes that succeed; the refusals, gift-card arithmetic and
same-product rules below are checked on a small world written here, against
tau-bench's semantics (``tau_bench/envs/retail/tools/*.py``).
"""

from __future__ import annotations

import json
from copy import deepcopy
from pathlib import Path
from typing import Any

import pytest

from factory.envs.registry import get_environment, get_plugin
from factory.envs.retail import RetailEnv
from factory.envsim.fidelity import load_trajectories, main, replay_fidelity

# --- the bar: every observation of the replays ---------------------------------------------------


def test_all_4073_replayed_observations_match(retail_dir: Path) -> None:
    base = get_environment("retail", db_dir=retail_dir)
    report = replay_fidelity(base.copy, load_trajectories(retail_dir / "replays-train.json"))
    assert report.mismatches == []
    assert (report.matched, report.total, report.trajectories) == (4073, 4073, 500)
    assert report.unanswered == 0
    assert len(report.per_tool) == 11  # every tool the replays call


def test_fidelity_cli_on_retail(retail_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "--domain",
            "retail",
            "--db",
            str(retail_dir),
            "--trajectories",
            str(retail_dir / "replays-train.json"),
        ]
    )
    assert code == 0
    assert "4073/4073 observations match (500 trajectories)" in capsys.readouterr().out


def test_the_plugin_is_registered_through_the_entry_point() -> None:
    plugin = get_plugin("retail", needs="environment")
    assert plugin.name == "retail"
    assert plugin.tool_functions is not None and len(plugin.tool_functions()) == 16
    assert {"n_users", "n_orders", "n_products"} <= plugin.world_sizes


# --- a small world written here ------------------------------------------------------------------

KETTLE, MAT = "1000000001", "1000000002"


def _world() -> dict[str, Any]:
    def variant(item_id: str, price: float, available: bool = True, **options: str) -> Any:
        return item_id, {
            "item_id": item_id,
            "options": options,
            "available": available,
            "price": price,
        }

    def item(product: str, name: str, variant_id: str, price: float, **options: str) -> Any:
        return {
            "name": name,
            "product_id": product,
            "item_id": variant_id,
            "price": price,
            "options": options,
        }

    address = {
        "address1": "1 Main Street",
        "address2": "Suite 100",
        "city": "Austin",
        "country": "USA",
        "state": "TX",
        "zip": "78701",
    }
    kettle_1l = item(KETTLE, "Electric Kettle", "2000000001", 50.0, capacity="1L")
    mat_4mm = item(MAT, "Yoga Mat", "3000000001", 30.0, thickness="4mm")

    def order(oid: str, status: str, items: list[Any], *payments: tuple[str, str, float]) -> Any:
        return {
            "order_id": oid,
            "user_id": "ann_lee_1",
            "address": dict(address),
            "items": deepcopy(items),
            "fulfillments": [],
            "status": status,
            "payment_history": [
                {"transaction_type": t, "amount": a, "payment_method_id": m} for t, m, a in payments
            ],
        }

    world = {
        "products": {
            KETTLE: {
                "name": "Electric Kettle",
                "product_id": KETTLE,
                "variants": dict(
                    [
                        variant("2000000001", 50.0, capacity="1L"),
                        variant("2000000002", 80.5, capacity="2L"),
                        variant("2000000003", 60.0, False, capacity="1.5L"),
                    ]
                ),
            },
            MAT: {
                "name": "Yoga Mat",
                "product_id": MAT,
                "variants": dict(
                    [
                        variant("3000000001", 30.0, thickness="4mm"),
                        variant("3000000002", 25.25, thickness="6mm"),
                    ]
                ),
            },
        },
        "users": {
            "ann_lee_1": {
                "name": {"first_name": "Ann", "last_name": "Lee"},
                "address": dict(address),
                "email": "Ann.Lee@example.com",
                "payment_methods": {
                    "credit_card_1": {
                        "source": "credit_card",
                        "brand": "visa",
                        "last_four": "1234",
                        "id": "credit_card_1",
                    },
                    "gift_card_1": {"source": "gift_card", "balance": 20.0, "id": "gift_card_1"},
                    "paypal_1": {"source": "paypal", "id": "paypal_1"},
                },
                "orders": ["#W1", "#W2", "#W3", "#W4"],
            },
            "bob_kim_2": {
                "name": {"first_name": "Bob", "last_name": "Kim"},
                "address": {**address, "zip": "78702"},
                "email": "bob@example.com",
                "payment_methods": {
                    "gift_card_9": {"source": "gift_card", "balance": 500.0, "id": "gift_card_9"}
                },
                "orders": [],
            },
        },
        "orders": {
            "#W1": order("#W1", "pending", [kettle_1l, mat_4mm], ("payment", "gift_card_1", 80.0)),
            "#W2": order(
                "#W2",
                "delivered",
                [kettle_1l, kettle_1l, mat_4mm],
                ("payment", "credit_card_1", 130.0),
            ),
            "#W3": order("#W3", "processed", [mat_4mm], ("payment", "paypal_1", 30.0)),
            "#W4": order(
                "#W4",
                "pending",
                [mat_4mm],
                ("payment", "credit_card_1", 30.0),
                ("payment", "paypal_1", 0.0),
            ),
        },
    }
    return json.loads(json.dumps(world))  # no shared objects, as a world read from JSON


@pytest.fixture
def env() -> RetailEnv:
    return RetailEnv(_world())


def _refused(env: RetailEnv, name: str, args: dict[str, Any], message: str) -> None:
    before = deepcopy(env.state)
    assert env.execute(name, args) == message
    assert env.state == before  # a refusal writes nothing


def _items_args(oid: str, old: list[str], new: list[str], pay: str) -> dict[str, Any]:
    return {"order_id": oid, "item_ids": old, "new_item_ids": new, "payment_method_id": pay}


# --- statuses ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        (
            "cancel_pending_order",
            {"order_id": "#W3", "reason": "no longer needed"},
            "Error: non-pending order cannot be cancelled",
        ),
        (
            "modify_pending_order_items",
            _items_args("#W2", ["3000000001"], ["3000000002"], "credit_card_1"),
            "Error: non-pending order cannot be modified",
        ),
        (
            "modify_pending_order_payment",
            {"order_id": "#W3", "payment_method_id": "credit_card_1"},
            "Error: non-pending order cannot be modified",
        ),
        (
            "return_delivered_order_items",
            {"order_id": "#W1", "item_ids": ["3000000001"], "payment_method_id": "gift_card_1"},
            "Error: non-delivered order cannot be returned",
        ),
        (
            "exchange_delivered_order_items",
            _items_args("#W3", ["3000000001"], ["3000000002"], "paypal_1"),
            "Error: non-delivered order cannot be exchanged",
        ),
        ("get_order_details", {"order_id": "W1"}, "Error: order not found"),
        (
            "cancel_pending_order",
            {"order_id": "#W9", "reason": "no longer needed"},
            "Error: order not found",
        ),
        ("get_product_details", {"product_id": "2000000001"}, "Error: product not found"),
        ("get_user_details", {"user_id": "ann_lee"}, "Error: user not found"),
    ],
)
def test_wrong_status_or_id_is_refused(
    env: RetailEnv, name: str, args: dict[str, Any], message: str
) -> None:
    _refused(env, name, args, message)


def test_address_change_needs_a_pending_order(env: RetailEnv) -> None:
    address = {
        "address1": "2 Oak Lane",
        "address2": "",
        "city": "Denver",
        "state": "CO",
        "country": "USA",
        "zip": "80201",
    }
    _refused(
        env,
        "modify_pending_order_address",
        {"order_id": "#W2", **address},
        "Error: non-pending order cannot be modified",
    )
    out = json.loads(env.execute("modify_pending_order_address", {"order_id": "#W1", **address}))
    assert out["address"] == address == env.state["orders"]["#W1"]["address"]
    assert out["status"] == "pending"  # an address change keeps the status
    assert env.state["users"]["ann_lee_1"]["address"]["city"] == "Austin"  # the user's stays


# --- cancellation --------------------------------------------------------------------------------


def test_cancel_refunds_a_gift_card_at_once(env: RetailEnv) -> None:
    _refused(
        env,
        "cancel_pending_order",
        {"order_id": "#W1", "reason": "too expensive"},
        "Error: invalid reason",
    )
    out = json.loads(
        env.execute("cancel_pending_order", {"order_id": "#W1", "reason": "ordered by mistake"})
    )
    assert out["status"] == "cancelled" and out["cancel_reason"] == "ordered by mistake"
    assert out["payment_history"][-1] == {
        "transaction_type": "refund",
        "amount": 80.0,
        "payment_method_id": "gift_card_1",
    }
    assert env.state["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 100.0
    _refused(
        env,
        "cancel_pending_order",
        {"order_id": "#W1", "reason": "no longer needed"},
        "Error: non-pending order cannot be cancelled",
    )


def test_cancel_refunds_every_payment_but_only_gift_cards_get_balance(env: RetailEnv) -> None:
    out = json.loads(
        env.execute("cancel_pending_order", {"order_id": "#W4", "reason": "no longer needed"})
    )
    refunds = [p for p in out["payment_history"] if p["transaction_type"] == "refund"]
    assert [(p["payment_method_id"], p["amount"]) for p in refunds] == [
        ("credit_card_1", 30.0),
        ("paypal_1", 0.0),
    ]
    assert env.state["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 20.0


# --- item modification ---------------------------------------------------------------------------


def test_cheaper_item_refunds_the_difference_to_a_gift_card(env: RetailEnv) -> None:
    args = _items_args("#W1", ["3000000001"], ["3000000002"], "gift_card_1")
    out = json.loads(env.execute("modify_pending_order_items", args))
    assert out["status"] == "pending (item modified)"
    mat = out["items"][1]
    assert (mat["item_id"], mat["price"], mat["options"]) == (
        "3000000002",
        25.25,
        {"thickness": "6mm"},
    )
    assert out["payment_history"][-1] == {
        "transaction_type": "refund",
        "amount": 4.75,
        "payment_method_id": "gift_card_1",
    }
    assert env.state["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 24.75
    # The order is no longer "pending": a second modification is refused.
    _refused(env, "modify_pending_order_items", args, "Error: non-pending order cannot be modified")


def test_pricier_item_needs_gift_card_balance(env: RetailEnv) -> None:
    args = _items_args("#W1", ["2000000001"], ["2000000002"], "gift_card_1")
    _refused(
        env,
        "modify_pending_order_items",
        args,
        "Error: insufficient gift card balance to pay for the new item",
    )
    out = json.loads(
        env.execute("modify_pending_order_items", {**args, "payment_method_id": "paypal_1"})
    )
    assert out["payment_history"][-1] == {
        "transaction_type": "payment",
        "amount": 30.5,
        "payment_method_id": "paypal_1",
    }
    assert env.state["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 20.0


@pytest.mark.parametrize("tool", ["modify_pending_order_items", "exchange_delivered_order_items"])
@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (["2000000001"], ["2000000003"], "Error: new item 2000000003 not found or available"),
        # A variant of another product is no replacement: the same-product rule.
        (["3000000001"], ["2000000002"], "Error: new item 2000000002 not found or available"),
        (
            ["2000000001"],
            ["2000000002", "2000000002"],
            "Error: the number of items to be exchanged should match",
        ),
        (["4000000000"], ["2000000002"], "Error: 4000000000 not found"),
        (["3000000001", "3000000001"], ["3000000002", "3000000002"], "Error: 3000000001 not found"),
    ],
)
def test_replacement_items_must_exist_match_and_be_available(
    env: RetailEnv, tool: str, old: list[str], new: list[str], message: str
) -> None:
    oid = "#W1" if tool == "modify_pending_order_items" else "#W2"
    _refused(env, tool, _items_args(oid, old, new, "credit_card_1"), message)


def test_payment_method_must_be_the_owners(env: RetailEnv) -> None:
    args = _items_args("#W1", ["3000000001"], ["3000000002"], "gift_card_9")  # Bob's card
    _refused(env, "modify_pending_order_items", args, "Error: payment method not found")
    _refused(
        env,
        "modify_pending_order_payment",
        {"order_id": "#W1", "payment_method_id": "gift_card_9"},
        "Error: payment method not found",
    )


def test_duplicate_items_are_replaced_one_by_one() -> None:
    state = _world()
    state["orders"]["#W2"]["status"] = "pending"
    world = RetailEnv(state)
    args = _items_args(
        "#W2", ["2000000001", "2000000001"], ["2000000002", "2000000001"], "paypal_1"
    )
    out = json.loads(world.execute("modify_pending_order_items", args))
    assert [i["item_id"] for i in out["items"]] == ["2000000002", "2000000001", "3000000001"]
    assert out["payment_history"][-1]["amount"] == 30.5


# --- exchange and return -------------------------------------------------------------------------


def test_exchange_of_two_items_requests_it_with_the_difference(env: RetailEnv) -> None:
    args = _items_args(
        "#W2", ["2000000001", "2000000001"], ["2000000002", "2000000002"], "gift_card_1"
    )
    _refused(
        env,
        "exchange_delivered_order_items",
        args,
        "Error: insufficient gift card balance to pay for the price difference",
    )
    out = json.loads(
        env.execute(
            "exchange_delivered_order_items", {**args, "payment_method_id": "credit_card_1"}
        )
    )
    assert out["status"] == "exchange requested"
    assert out["exchange_items"] == ["2000000001", "2000000001"]
    assert out["exchange_new_items"] == ["2000000002", "2000000002"]
    assert out["exchange_price_difference"] == 61.0
    assert out["exchange_payment_method_id"] == "credit_card_1"
    assert [i["item_id"] for i in out["items"]] == ["2000000001", "2000000001", "3000000001"]
    assert len(out["payment_history"]) == 1  # nothing is charged until the exchange happens
    _refused(
        env,
        "return_delivered_order_items",
        {"order_id": "#W2", "item_ids": ["3000000001"], "payment_method_id": "credit_card_1"},
        "Error: non-delivered order cannot be returned",
    )


def test_cheaper_exchange_on_a_poor_gift_card_passes(env: RetailEnv) -> None:
    args = _items_args("#W2", ["3000000001"], ["3000000002"], "gift_card_1")
    out = json.loads(env.execute("exchange_delivered_order_items", args))
    assert out["exchange_price_difference"] == -4.75
    assert env.state["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 20.0


def test_return_goes_to_the_original_method_or_a_gift_card(env: RetailEnv) -> None:
    base = {"order_id": "#W2", "item_ids": ["3000000001", "2000000001"]}
    _refused(
        env,
        "return_delivered_order_items",
        {**base, "payment_method_id": "paypal_1"},
        "Error: payment method should be either the original payment method or a gift card",
    )
    _refused(
        env,
        "return_delivered_order_items",
        {**base, "item_ids": ["2000000001"] * 3, "payment_method_id": "credit_card_1"},
        "Error: some item not found",
    )
    out = json.loads(
        env.execute("return_delivered_order_items", {**base, "payment_method_id": "gift_card_1"})
    )
    assert out["status"] == "return requested"
    assert out["return_items"] == ["2000000001", "3000000001"]  # sorted
    assert out["return_payment_method_id"] == "gift_card_1"
    assert env.state["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 20.0


# --- payment change ------------------------------------------------------------------------------


def test_payment_change_rules(env: RetailEnv) -> None:
    _refused(
        env,
        "modify_pending_order_payment",
        {"order_id": "#W1", "payment_method_id": "gift_card_1"},
        "Error: the new payment method should be different from the current one",
    )
    _refused(
        env,
        "modify_pending_order_payment",
        {"order_id": "#W4", "payment_method_id": "gift_card_1"},
        "Error: there should be exactly one payment for a pending order",
    )
    state = _world()
    state["orders"]["#W3"]["status"] = "pending"  # 30.0 by PayPal; the gift card holds 20.0
    world = RetailEnv(state)
    _refused(
        world,
        "modify_pending_order_payment",
        {"order_id": "#W3", "payment_method_id": "gift_card_1"},
        "Error: insufficient gift card balance to pay for the order",
    )
    # Gift card -> card: the card pays, the gift card is refunded at once.
    out = json.loads(
        env.execute(
            "modify_pending_order_payment",
            {"order_id": "#W1", "payment_method_id": "credit_card_1"},
        )
    )
    assert out["payment_history"][1:] == [
        {"transaction_type": "payment", "amount": 80.0, "payment_method_id": "credit_card_1"},
        {"transaction_type": "refund", "amount": 80.0, "payment_method_id": "gift_card_1"},
    ]
    assert out["status"] == "pending"
    assert env.state["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 100.0
    _refused(
        env,
        "modify_pending_order_payment",
        {"order_id": "#W1", "payment_method_id": "paypal_1"},
        "Error: there should be exactly one payment for a pending order",
    )


# --- users, products, lookups --------------------------------------------------------------------


def test_lookups_and_user_address(env: RetailEnv) -> None:
    assert env.execute("find_user_id_by_email", {"email": "ANN.lee@EXAMPLE.com"}) == "ann_lee_1"
    assert (
        env.execute("find_user_id_by_email", {"email": "ann@example.com"})
        == "Error: user not found"
    )
    by_name = {"first_name": "ann", "last_name": "LEE", "zip": "78701"}
    assert env.execute("find_user_id_by_name_zip", by_name) == "ann_lee_1"
    assert (
        env.execute("find_user_id_by_name_zip", {**by_name, "zip": "78702"})
        == "Error: user not found"
    )
    assert json.loads(env.execute("list_all_product_types", {})) == {
        "Electric Kettle": KETTLE,
        "Yoga Mat": MAT,
    }
    address = {
        "address1": "9 Elm",
        "address2": "",
        "city": "Reno",
        "state": "NV",
        "country": "USA",
        "zip": "89501",
    }
    _refused(env, "modify_user_address", {"user_id": "nobody", **address}, "Error: user not found")
    out = json.loads(env.execute("modify_user_address", {"user_id": "ann_lee_1", **address}))
    assert out["address"] == address == env.state["users"]["ann_lee_1"]["address"]
    assert env.state["orders"]["#W1"]["address"]["city"] == "Austin"  # orders keep theirs


@pytest.mark.parametrize(
    ("expression", "answer"),
    [
        ("2 + 2", "4.0"),
        ("10 / 3", "3.33"),
        ("(80.5 - 50) * 2", "61.0"),
        ("1 / 0", "Error: division by zero"),
        ("2 ^ 3", "Error: invalid characters in expression"),
        ("price * 2", "Error: invalid characters in expression"),
        ("", "Error: invalid syntax (<string>, line 0)"),
    ],
)
def test_calculate(env: RetailEnv, expression: str, answer: str) -> None:
    assert env.execute("calculate", {"expression": expression}) == answer


def test_think_and_transfer_change_nothing(env: RetailEnv) -> None:
    before = deepcopy(env.state)
    assert env.execute("think", {"thought": "check the balance"}) == ""
    assert (
        env.execute("transfer_to_human_agents", {"summary": "wants a refund"})
        == "Transfer successful"
    )
    assert env.state == before


# --- malformed calls -----------------------------------------------------------------------------


def test_malformed_calls_are_error_observations(env: RetailEnv) -> None:
    _refused(env, "refund_everything", {}, "Error: unknown tool 'refund_everything'")
    _refused(
        env,
        "cancel_pending_order",
        {"order_id": "#W1"},
        # in the tool's terms: a simulator can derive this from the spec, not Python's
        # "CancelPendingOrder.invoke() missing 1 required positional argument" (issue 10)
        "Error: missing required argument 'reason' for cancel_pending_order "
        "(cancel_pending_order takes 'order_id', 'reason')",
    )
    _refused(
        env,
        "return_delivered_order_items",
        {"order_id": "#W2", "item_ids": "3000000001", "payment_method_id": "credit_card_1"},
        "Error: invalid argument item_ids for return_delivered_order_items: "
        "'3000000001' is not of type 'array'",
    )
    _refused(
        env,
        "get_order_details",
        ["#W1"],
        "Error: arguments of get_order_details must be a JSON object, not list",
    )


def test_unvalidated_calls_behave_as_in_tau_bench() -> None:
    # A string where a list belongs is counted character by character, as in tau-bench.
    env = RetailEnv(_world(), validate_arguments=False)
    args = {"order_id": "#W2", "item_ids": "3000000001", "payment_method_id": "credit_card_1"}
    assert env.execute("return_delivered_order_items", args) == "Error: some item not found"
    # and a missing argument reads as tau-bench's Python error
    assert env.execute("cancel_pending_order", {"order_id": "#W1"}) == (
        "Error: CancelPendingOrder.invoke() missing 1 required positional argument: 'reason'"
    )


# --- forks ---------------------------------------------------------------------------------------


def test_forks_are_independent(env: RetailEnv) -> None:
    fork = env.copy()
    fork.execute("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})
    assert env.state["orders"]["#W1"]["status"] == "pending"
    assert env.state["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 20.0
    assert fork.state["users"]["ann_lee_1"]["payment_methods"]["gift_card_1"]["balance"] == 100.0
    assert fork.state["products"][KETTLE] is env.state["products"][KETTLE]  # untouched: shared
    env.execute(
        "modify_user_address",
        {
            "user_id": "bob_kim_2",
            "address1": "x",
            "address2": "",
            "city": "y",
            "state": "z",
            "country": "USA",
            "zip": "1",
        },
    )
    assert fork.state["users"]["bob_kim_2"]["address"]["city"] == "Austin"


def test_generated_world_runs_every_tool() -> None:
    env = get_environment("retail", seed=3, n_users=20, n_orders=40, n_products=10)
    assert isinstance(env, RetailEnv) and len(env.state["orders"]) == 40
    user_id, user = next(iter(env.state["users"].items()))
    assert env.execute("find_user_id_by_email", {"email": user["email"]}) == user_id
