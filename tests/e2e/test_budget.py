"""Budgets you can trust: a cost cap needs prices, refused calls are ``unissued`` in every
stage, spend counts every stage, and a run short of its target does not exit 0."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from factory.engine.runner import run
from factory.errors import EXIT_BUDGET, EXIT_INCOMPLETE, ConfigError
from tests.conftest import ROOT
from tests.helpers import dev_overrides, readme_commands, recipe

PRICE = (
    "prices={factory-dev: {input_per_mtok: 2.0, cached_input_per_mtok: 2.0, output_per_mtok: 8.0}}"
)


@pytest.mark.parametrize(
    ("overrides", "model", "key"),
    [
        (["llm.model=my-local-model"], "my-local-model", "llm.model"),
        (["prefilter.model=judge-x"], "judge-x", "prefilter.model"),
    ],
)
def test_a_cost_cap_over_an_unpriced_model_is_refused_naming_model_and_fix(
    overrides: list[str], model: str, key: str
) -> None:
    from factory.engine.budget import check_cost_cap_priced

    cfg = recipe("airline.yaml", Path("/nonexistent"), *overrides)
    assert cfg.amplify is not None and cfg.amplify.max_cost_usd == 2000
    with pytest.raises(ConfigError) as info:
        check_cost_cap_priced(cfg)
    text = str(info.value)
    assert info.value.key_path == f"prices.{model}"
    assert f"{key} {model!r} has no price" in text and "prices: {" + model in text


def test_priced_or_uncapped_recipes_pass() -> None:
    from factory.engine.budget import check_cost_cap_priced

    for model in ("gpt-5", "gpt-5-nano", "o3", "gpt-4o-mini"):
        check_cost_cap_priced(recipe("airline.yaml", Path("/x"), f"llm.model={model}"))
    mine = ("llm.model=mine", "prefilter.model=o4-mini")
    check_cost_cap_priced(
        recipe(
            "airline.yaml", Path("/x"), *mine, "prices.mine={input_per_mtok: 1, output_per_mtok: 2}"
        )
    )
    check_cost_cap_priced(recipe("airline.yaml", Path("/x"), *mine, "amplify.max_cost_usd=null"))


def test_run_refuses_an_unpriced_cap_before_touching_the_folder(devserver, tmp_path) -> None:
    server = devserver(seed=51)
    out = tmp_path / "o"
    cfg = recipe(
        "airline.yaml", out, *dev_overrides(server.url, target=5), "amplify.max_cost_usd=1"
    )
    with pytest.raises(ConfigError, match="factory-dev"):
        run(cfg, out, progress=False)
    assert not out.exists() and server.stats()["requests"] == 0


@pytest.mark.ray
def test_the_readme_offline_command_keeps_its_cap_and_counts_cost(
    ray_session, tmp_path, capsys, monkeypatch
) -> None:
    """The README's third set-up command as written there, only its target smaller and
    its output folder a temporary one (.ci/run runs it unchanged)."""
    from factory.run import main

    command = shlex.split(readme_commands()[2])
    assert command[:3] == [".venv/bin/python", "-m", "factory.run"], command
    args = command[3:]
    assert "amplify.target=500" in args and "--output" in args, args
    args[args.index("amplify.target=500")] = "amplify.target=5"
    out = tmp_path / "o"
    args[args.index("--output") + 1] = str(out)
    monkeypatch.chdir(ROOT)  # the bare recipe name resolves under pipelines/, as from a clone
    code = main([*args, "--no-progress"])
    assert code == 0, capsys.readouterr().err[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["cost_usd"] > 0  # the dev model is priced, so the recipe's cap can act
    assert manifest["by_stage"]["prefilter"]["cost_usd"] > 0


@pytest.mark.ray
def test_judge_calls_refused_by_a_cap_are_unissued_not_seed_rejects(
    ray_session, devserver, tmp_path
) -> None:
    server = devserver(seed=52)
    out = tmp_path / "o"
    cfg = recipe(
        "airline.yaml",
        out,
        *dev_overrides(server.url, target=10),
        "amplify.max_calls=3",
        "llm.concurrency=2",
        "llm.per_actor_concurrency=1",
    )
    result = run(cfg, out, progress=False)
    seeds = result.manifest["seeds"]
    assert result.exit_code == EXIT_BUDGET and result.stopped_by == "max_calls"
    assert not any("budget" in k for k in seeds["reasons"])  # no seed "rejected" by a cap
    assert seeds["unissued"] >= 41 - 3 - 2  # three allowed, plus at most the two in flight
    assert seeds["total"] == seeds["kept"] + seeds["rejected"] + seeds["failed"] + seeds["unissued"]
    assert result.manifest["unissued_by_stage"]["prefilter"] == seeds["unissued"]
    assert result.manifest["unissued"] >= seeds["unissued"]
    assert server.stats()["completed"] <= 3


@pytest.mark.ray
def test_spend_paid_this_run_counts_the_judge_too(ray_session, devserver, tmp_path) -> None:
    server = devserver(seed=53)
    out = tmp_path / "o"
    cfg = recipe("airline.yaml", out, *dev_overrides(server.url, target=8), PRICE)
    result = run(cfg, out, progress=False)
    m = result.manifest
    judge = m["by_stage"]["prefilter"]["cost_usd"]
    assert judge > 0 and m["responses_from_cache"] == 0  # a new run paid for everything
    assert m["cost_usd_paid_this_run"] == pytest.approx(m["cost_usd"])
    assert m["cost_usd"] == pytest.approx(judge + m["by_stage"]["amplify"]["cost_usd"])


@pytest.mark.ray
def test_a_run_whose_calls_all_fail_exits_incomplete_not_0(
    ray_session, devserver, tmp_path
) -> None:
    server = devserver(seed=54, defects={"server_error": 1.0})
    out = tmp_path / "o"
    # Target 20: its first calls (20 in a row without a row end the run) go out and fail
    # together; a smaller target trickles them through the endpoint breaker's doubling
    # cooldowns (1 s to 30 s), 63-153 s of waiting for the same promise.
    cfg = recipe(
        "airline.yaml",
        out,
        *dev_overrides(server.url, target=20),
        "prefilter.enabled=false",
        "llm.retry.max_attempts=1",
    )
    result = run(cfg, out, progress=False)
    assert result.manifest["target"]["reached"] is False
    assert result.stopped_by == "no_progress" and result.exit_code == EXIT_INCOMPLETE
    state = json.loads((out / "run.json").read_text())
    assert state["status"] == "stopped"  # resumable: the next run tries again
    assert "stopped before the target" in result.summary()
