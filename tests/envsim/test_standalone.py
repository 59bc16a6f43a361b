"""Simulator rows that stand alone (issue 10, points 5 and 6), without Ray.

Every output value of an envsim row must be derivable from its instruction and
input (the current time and the new-id rules are stated), tool errors are in the
tool's own terms, a mixture can require every tool, and the executor's argument
validation is a recipe option that works both ways.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from factory.core.mixture import Mixture
from factory.core.selection import held_out, select
from factory.engine.jobs.envsim import EpisodeStage, alpaca_row
from factory.envs.airline import AirlineEnv
from factory.envs.base import binding_error
from factory.envs.registry import generate_environment
from factory.envsim.sampler import EpisodeSampler
from factory.envsim.simulator import check_sample
from factory.errors import ConfigError
from tests.conftest import ROOT as REPO_ROOT
from tests.helpers import recipe, underivable

ROOT = REPO_ROOT
TOOLS = {t["name"]: t for t in json.loads((ROOT / "prompts/airline/tools.json").read_text())}
# Values a simulator could only have memorised: ids, codes and timestamps (a token with a digit
# or in capitals). Plain numbers are left out: prices and sums are computed from the input.


WANTED = {"book_reservation", "send_certificate", "list_all_airports"}


def sample_until(domain: str, wanted: set[str]) -> list[dict[str, Any]]:
    """Step samples of ``domain``'s sampler (150 at least), until every ``wanted`` tool
    succeeded once: the calls that create or compute values are in the scan."""
    sampler = EpisodeSampler(domain, 0)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index in range(400):
        for step in sampler.steps(1, seed=0, start=index):
            out.append(step.to_dict())
            if not step.observation.startswith("Error"):
                seen.add(step.tool)
        if seen >= wanted and len(out) >= 150:
            break
    assert seen >= wanted
    return out


@pytest.fixture(scope="module")
def samples() -> list[dict[str, Any]]:
    """Step samples of the airline sampler, until the tools that create values were called."""
    return sample_until("airline", WANTED)


@pytest.mark.parametrize("layout", ["factory", "envsimbench"])
def test_every_output_value_is_derivable_from_instruction_and_input(
    samples: list[dict[str, Any]], tmp_path: Path, layout: str
) -> None:
    cfg = recipe("airline-envsim.yaml", tmp_path, f"envsim.layout={layout}")
    bad = {}
    for sample in samples:
        row = alpaca_row(cfg, sample, TOOLS)
        missing = underivable(row)
        if missing:
            bad[sample["tool"]] = missing
    assert bad == {}
    # the scan does see the values it is about
    booked = next(
        s for s in samples if s["tool"] == "book_reservation" and s["delta"] and s["labels"]
    )
    row = alpaca_row(cfg, booked, TOOLS)
    assert "2024-05-15T15:00:00" in row["output"] and "2024-05-15T15:00:00" in row["instruction"]


def test_the_scan_flags_a_row_without_the_facts(samples: list[dict[str, Any]]) -> None:
    from factory.envsim.simulator import to_alpaca

    booked = next(s for s in samples if s["tool"] == "book_reservation" and s["delta"])
    row = to_alpaca(booked, tool_spec=TOOLS["book_reservation"])  # no facts
    assert "2024-05-15T15:00:00" in underivable(row)


def test_alpaca_rows_read_back_as_the_same_sample(
    samples: list[dict[str, Any]], tmp_path: Path
) -> None:
    cfg = recipe("airline-envsim.yaml", tmp_path)
    for sample in samples[:40]:
        back = check_sample(alpaca_row(cfg, sample, TOOLS))
        assert back["tool"] == sample["tool"] and back["arguments"] == sample["arguments"]
        assert back["state_after"] == sample["state_after"]
        assert back["observation"] == sample["observation"]
        # asked as it was trained: the simulator's instructions as the system prompt
        assert [m["role"] for m in back["prompt"]] == ["system", "user"]
        assert back["prompt"][0]["content"].startswith("You simulate the back end")


# --- tool errors in the tool's own terms -----------------------------------------------------


def test_no_error_names_python_internals(samples: list[dict[str, Any]]) -> None:
    errors = [s["observation"] for s in samples if s["observation"].startswith("Error")]
    assert errors
    for text in errors:
        assert ".invoke()" not in text and "positional argument" not in text, text
        assert "keyword argument" not in text and "Traceback" not in text, text


def test_binding_errors_name_only_the_tool_and_its_arguments() -> None:
    env = AirlineEnv.create(seed=0)
    got = env.execute("search_direct_flight", {"origin": "JFK", "destination": "SFO"})
    assert got == (
        "Error: missing required argument 'date' for search_direct_flight "
        "(search_direct_flight takes 'origin', 'destination', 'date')"
    )
    got = env.execute("list_all_airports", {"city": "x"})
    assert got == (
        "Error: unexpected argument 'city' for list_all_airports "
        "(list_all_airports takes no arguments)"
    )

    def takes_any(data: Any, a: int, **more: Any) -> str:
        return ""

    import inspect

    assert binding_error("t", inspect.signature(takes_any), {"a": 1, "b": 2}) is None
    assert binding_error("t", inspect.signature(takes_any), {}) == (
        "missing required argument 'a' for t (t takes 'a')"
    )


# --- validate_arguments: both ways ------------------------------------------------------------


def _user(env: Any) -> str:
    return next(iter(env.state["users"]))


def test_validate_arguments_true_refuses_a_wrong_type() -> None:
    env = EpisodeSampler("airline", 0).fresh_env()
    got = env.execute("send_certificate", {"user_id": _user(env), "amount": "50"})
    assert got.startswith("Error: invalid argument amount for send_certificate")
    assert not any(
        m.get("amount") == "50" for m in env.state["users"][_user(env)]["payment_methods"].values()
    )


def test_validate_arguments_false_runs_the_call_as_tau_bench() -> None:
    env = EpisodeSampler("airline", 0, validate_arguments=False).fresh_env()
    user = _user(env)
    got = env.execute("send_certificate", {"user_id": user, "amount": "50"})
    # tau-bench stores the string it was given
    assert got == f"Certificate certificate_3221322 added to user {user} with amount 50."
    assert env.state["users"][user]["payment_methods"]["certificate_3221322"]["amount"] == "50"
    # a missing argument is refused either way (tau-bench cannot call the tool at all)
    assert env.execute("send_certificate", {"user_id": user}).startswith("Error: missing")


def test_the_recipe_option_reaches_the_executor(tmp_path: Path) -> None:
    on_cfg = recipe("airline-envsim.yaml", tmp_path)
    off_cfg = recipe("airline-envsim.yaml", tmp_path, "envsim.validate_arguments=false")
    on = EpisodeStage(on_cfg.envsim, on_cfg.domain.name)  # what the job's spec carries
    off = EpisodeStage(off_cfg.envsim, off_cfg.domain.name)
    assert on.sampler.fresh_env().validate_arguments is True
    assert off.sampler.fresh_env().validate_arguments is False


def test_a_domain_without_the_switch_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from factory.envsim import sampler as sampler_module

    def strict(domain: str, seed: int, sizes: Any, **kw: Any) -> Any:
        if kw:
            raise TypeError("environment() got an unexpected keyword argument")
        return generate_environment(domain, seed, sizes)

    monkeypatch.setattr(sampler_module, "generate_environment", strict)
    EpisodeSampler("airline", 0)  # the default asks nothing of the domain
    with pytest.raises(ConfigError, match="validate_arguments"):
        EpisodeSampler("airline", 0, validate_arguments=False)


# --- retail: the same bar ---------------------------------------------------------------------

RETAIL_TOOLS = {t["name"]: t for t in json.loads((ROOT / "prompts/retail/tools.json").read_text())}
RETAIL_WANTED = {
    "exchange_delivered_order_items",
    "return_delivered_order_items",
    "modify_pending_order_items",
    "modify_pending_order_payment",
    "cancel_pending_order",
}


@pytest.fixture(scope="module")
def retail_samples() -> list[dict[str, Any]]:
    """Step samples of the retail sampler, until its writes that compute values were called."""
    return sample_until("retail", RETAIL_WANTED)


@pytest.mark.parametrize("layout", ["factory", "envsimbench"])
def test_retail_outputs_are_derivable_and_its_errors_speak_the_tools_terms(
    retail_samples: list[dict[str, Any]], tmp_path: Path, layout: str
) -> None:
    cfg = recipe("retail-envsim.yaml", tmp_path, f"envsim.layout={layout}")
    bad = {}
    for sample in retail_samples:
        missing = underivable(alpaca_row(cfg, sample, RETAIL_TOOLS))
        if missing:
            bad[sample["tool"]] = missing
    assert bad == {}
    errors = [s["observation"] for s in retail_samples if s["observation"].startswith("Error")]
    assert errors  # the sampler's wrong calls are in the scan
    internals = ("invoke()", "positional argument", "Traceback", "KeyError", "NoneType")
    assert [e for e in errors if any(word in e for word in internals)] == []


# --- tool balance -------------------------------------------------------------------------------


def _rows(spec: dict[str, int]) -> list[dict[str, Any]]:
    rows = []
    for tool, n in spec.items():
        for i in range(n):
            labels = {"kind": "step", "outcome": "no_change", "group": "No-Change", "tool": tool}
            rows.append({"id": f"{tool}-{i}", "labels": {**labels, "task_id": f"{tool}/{i}"}})
    return rows


def test_min_per_tool_makes_every_tool_appear() -> None:
    rows = _rows({"book": 300, "read": 300, "airports": 3})
    quota = {"name": "nc", "group": "No-Change", "count": 20}
    plain = select(rows, Mixture.from_dict({"name": "m", "quotas": [quota]}), seed=0)
    balanced = select(
        rows, Mixture.from_dict({"name": "m", "min_per_tool": 3, "quotas": [quota]}), seed=0
    )
    tools = balanced.summary()["tools"]
    assert tools["airports"] == 3 and sum(tools.values()) == 20
    assert plain.summary()["tools"].get("airports", 0) < 3  # what the option changes
    assert balanced.shortfall == {}


def test_a_tool_nobody_calls_is_a_shortfall() -> None:
    rows = _rows({"book": 10})
    mix = Mixture.from_dict(
        {
            "name": "m",
            "min_per_tool": 2,
            "quotas": [{"name": "nc", "group": "No-Change", "count": 5}],
        }
    )
    out = select(rows, mix, seed=0, tools=["book", "list_all_airports"])
    assert out.shortfall == {"tool:list_all_airports": 2}
    assert len(out.selected) == 5


def test_min_per_tool_is_checked_in_the_file() -> None:
    with pytest.raises(ConfigError, match="min_per_tool"):
        Mixture.from_dict(
            {
                "name": "m",
                "min_per_tool": -1,
                "quotas": [{"name": "f", "group": "Failure", "count": 1}],
            }
        )


def test_max_per_tool_caps_a_dominant_tool_and_fills_from_the_others() -> None:
    rows = _rows({"book": 600, "read": 100, "airports": 60})
    quota = {"name": "nc", "group": "No-Change", "count": 120}
    plain = select(rows, Mixture.from_dict({"name": "m", "quotas": [quota]}), seed=0)
    capped = select(
        rows,
        Mixture.from_dict({"name": "m", "min_per_tool": 5, "max_per_tool": 40, "quotas": [quota]}),
        seed=0,
    )
    assert plain.summary()["tools"]["book"] > 40  # what the option changes
    tools = capped.summary()["tools"]
    assert max(tools.values()) <= 40 and sum(tools.values()) == 120 and capped.shortfall == {}
    assert capped.tool_capped.get("book", 0) > 0 and "passed over" in capped.report()
    again = select(
        list(reversed(rows)),
        Mixture.from_dict({"name": "m", "min_per_tool": 5, "max_per_tool": 40, "quotas": [quota]}),
        seed=0,
    )
    assert sorted(again.ids) == sorted(capped.ids)  # deterministic whatever the order
    short = select(
        rows,
        Mixture.from_dict({"name": "m", "max_per_tool": 30, "quotas": [quota]}),
        seed=0,
    )
    assert short.shortfall == {"nc": 30} and len(short.selected) == 90  # 3 tools x 30


def test_max_per_tool_is_checked_and_scaled_with_the_mixture() -> None:
    quota = {"name": "f", "group": "Failure", "count": 100}
    for bad in (0, -3, "many", 2):
        with pytest.raises(ConfigError, match="max_per_tool"):
            Mixture.from_dict(
                {"name": "m", "min_per_tool": 3, "max_per_tool": bad, "quotas": [quota]}
            )
    mix = Mixture.from_dict({"name": "m", "min_per_tool": 3, "max_per_tool": 40, "quotas": [quota]})
    assert mix.scaled(0.1).max_per_tool == 4 and mix.scaled(0.01).max_per_tool == 3
    assert Mixture.from_dict(mix.to_dict()) == mix


# --- the held-out split's pure parts ----------------------------------------------------------


def test_held_out_is_a_function_of_the_id_alone() -> None:
    ids = [f"t{i}" for i in range(2000)]
    chosen = [t for t in ids if held_out({"task_id": t}, by="task", share=0.2, seed=1)]
    assert 300 < len(chosen) < 500
    assert chosen == [
        t for t in ids if held_out({"task_id": t, "user_id": "x"}, by="task", share=0.2, seed=1)
    ]
    assert not held_out({"user_id": "u"}, by="task", share=0.9, seed=1)


def test_scaled_mixture_rounds_up() -> None:
    mix = Mixture.load(ROOT / "pipelines/mixtures/balance2.yaml").scaled(0.1, "b2-heldout")
    assert [q.count for q in mix.quotas] == [100, 100, 200, 223]
    assert mix.name == "b2-heldout"
