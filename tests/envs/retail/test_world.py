"""The seeded retail world generator: deterministic, consistent, tau-bench's schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.envs.retail import RetailEnv
from factory.envs.retail.world import check_world, generate_world, main
from tests.conftest import SHARED

RETAIL = SHARED / "data" / "taubench-retail"


@pytest.fixture(scope="module")
def world() -> dict:
    return generate_world(7, n_users=120, n_orders=300, n_products=25)


def test_same_seed_same_world_other_seed_other_world(world: dict) -> None:
    again = generate_world(7, n_users=120, n_orders=300, n_products=25)
    assert json.dumps(again, sort_keys=True) == json.dumps(world, sort_keys=True)
    other = generate_world(8, n_users=120, n_orders=300, n_products=25)
    assert set(other["orders"]) != set(world["orders"])


def test_referential_integrity(world: dict) -> None:
    assert check_world(world) == []
    assert (len(world["users"]), len(world["orders"]), len(world["products"])) == (120, 300, 25)
    for oid, order in world["orders"].items():
        assert oid in world["users"][order["user_id"]]["orders"]
        paid = order["payment_history"][0]
        assert paid["transaction_type"] == "payment"
        assert paid["amount"] == round(sum(i["price"] for i in order["items"]), 2)
        for item in order["items"]:
            variant = world["products"][item["product_id"]]["variants"][item["item_id"]]
            assert (variant["price"], variant["options"]) == (item["price"], item["options"])
        if order["status"] == "pending":
            assert order["fulfillments"] == [] and len(order["payment_history"]) == 1
        if order["status"] in ("processed", "delivered"):
            assert order["fulfillments"][0]["item_ids"] == [i["item_id"] for i in order["items"]]
        if order["status"] == "cancelled":
            assert order["payment_history"][1]["transaction_type"] == "refund"
    statuses = {o["status"] for o in world["orders"].values()}
    assert statuses == {"pending", "processed", "delivered", "cancelled"}
    sources = {m["source"] for u in world["users"].values() for m in u["payment_methods"].values()}
    assert sources == {"credit_card", "paypal", "gift_card"}
    emails = [u["email"] for u in world["users"].values()]
    assert len(set(emails)) == len(emails)  # a lookup by email finds one user
    keys = [
        (u["name"]["first_name"], u["name"]["last_name"], u["address"]["zip"])
        for u in world["users"].values()
    ]
    assert len(set(keys)) == len(keys)  # and so does one by name and zip


def test_check_world_reports_broken_references(world: dict) -> None:
    broken = json.loads(json.dumps(world))
    order = next(iter(broken["orders"].values()))
    order["items"][0]["item_id"] = "0000000000"
    order["payment_history"][0]["payment_method_id"] = "gift_card_0"
    broken["users"][order["user_id"]]["orders"].append("#W0")
    problems = check_world(broken)
    assert any("is no variant of its product" in p for p in problems)
    assert any("gift_card_0 not the user's" in p for p in problems)
    assert any("#W0 missing" in p for p in problems)


def test_generated_schema_is_tau_benchs(world: dict) -> None:
    if not RETAIL.is_dir():
        pytest.skip(f"reference data not found at {RETAIL} (../shared is absent)")
    reference = RetailEnv.from_dir(RETAIL).state
    for table in ("users", "orders", "products"):
        want = next(iter(reference[table].values()))
        got = next(iter(world[table].values()))
        assert set(got) == set(want), table
    ref_methods = {
        m["source"]: set(m)
        for u in reference["users"].values()
        for m in u["payment_methods"].values()
    }
    got_methods = {
        m["source"]: set(m) for u in world["users"].values() for m in u["payment_methods"].values()
    }
    assert got_methods == ref_methods


def test_cli_writes_a_loadable_world(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "3", "--out", str(tmp_path), "--users", "5", "--orders", "9"]) == 0
    env = RetailEnv.from_dir(tmp_path)
    assert len(env.state["orders"]) == 9 and "9 orders" in capsys.readouterr().out
    assert env.state == generate_world(3, n_users=5, n_orders=9)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        generate_world(0, n_users=-1)
    with pytest.raises(ValueError, match="need at least one user"):
        generate_world(0, n_users=0, n_orders=3)
