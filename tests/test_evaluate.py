"""Simulator evaluation end to end: real step samples, the devserver as a (defective) simulator."""

from __future__ import annotations

import asyncio
import json
from copy import deepcopy
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory.core.delta import apply, diff, same_json
from factory.core.labels import step_labels
from factory.devserver import DevServer
from factory.envs.airline import AirlineEnv
from factory.envs.airline.slices import slice_for
from factory.envs.airline.world import generate_world
from factory.envs.registry import get_plugin
from factory.envsim.simulator import render_prediction
from factory.errors import LLMServerError, RepairError
from factory.evaluate import (
    EvalReport,
    evaluate,
    evaluate_async,
    llm_predictor,
    main,
    tool_sources,
)
from factory.llm import Endpoint, EndpointPool, LLMClient, RetryPolicy
from factory.llm.backends.openai import sdk_transport
from tests.conftest import ROOT
from tests.helpers import booking_args

ENV_ID = "airline-gen-3"


# --- step samples from real calls on a generated world ---------------------------------------


def _available_flight(state: dict[str, Any]) -> tuple[str, str, int]:
    for number, flight in state["flights"].items():
        for day, info in flight["dates"].items():
            if info["status"] == "available" and info["available_seats"]["economy"] >= 2:
                return number, day, info["prices"]["economy"]
    raise AssertionError("the generated world has no bookable flight")


def _onestop(state: dict[str, Any], origin: str, day: str) -> dict[str, Any]:
    """One-stop search arguments that find at least one connection, when the world has one."""
    env = AirlineEnv(state).copy()
    for destination in sorted({f["destination"] for f in state["flights"].values()}):
        arguments = {"origin": origin, "destination": destination, "date": day}
        if env.execute("search_onestop_flight", arguments) not in ("[]", ""):
            return arguments
    return {"origin": origin, "destination": "SEA", "date": day}


def _method(user: dict[str, Any], source: str) -> str | None:
    return next((k for k, m in user["payment_methods"].items() if m["source"] == source), None)


def _calls(state: dict[str, Any]) -> list[tuple[str, Any]]:
    """An episode touching every outcome: reads, failures, no-change writes, multi-op writes."""
    number, day, price = _available_flight(state)
    flight = state["flights"][number]
    payer = next(u for u in state["users"] if _method(state["users"][u], "gift_card"))
    user = state["users"][payer]
    card, gift = _method(user, "credit_card"), _method(user, "gift_card")
    rid = user["reservations"][0]
    res = state["reservations"][rid]
    gift_part = min(user["payment_methods"][gift]["amount"], price)
    me = [{**user["name"], "dob": user["dob"]}]
    booking = booking_args(state, user_id=payer, flight_number=number, date=day, passengers=me)
    del booking["payment_methods"]  # each call below pays its own way
    by_gift = [{"payment_id": gift, "amount": gift_part}]
    if price > gift_part:
        by_gift.append({"payment_id": card, "amount": price - gift_part})
    return [
        ("get_user_details", {"user_id": payer}),
        ("get_user_details", {"user_id": "nobody_at_all_0000"}),
        ("get_reservation_details", {"reservation_id": rid}),
        (
            "search_direct_flight",
            {"origin": flight["origin"], "destination": flight["destination"], "date": day},
        ),
        ("search_onestop_flight", _onestop(state, flight["origin"], day)),
        ("list_all_airports", {}),
        ("calculate", {"expression": "2 * (3 + 4.5)"}),
        ("think", {"thought": "The user wants to fly."}),
        ("fly_me_to_the_moon", {"user_id": payer}),
        ("get_user_details", {"user_id": 42}),
        ("send_certificate", {"user_id": payer, "amount": 2000}),
        (
            "book_reservation",
            {
                **booking,
                "payment_methods": [{"payment_id": "certificate_3221322", "amount": price}],
            },
        ),
        ("book_reservation", {**booking, "payment_methods": by_gift}),
        (
            "book_reservation",
            {**booking, "payment_methods": [{"payment_id": card, "amount": price + 1}]},
        ),
        ("cancel_reservation", {"reservation_id": "HATHAT"}),
        ("cancel_reservation", {"reservation_id": "ZZZZZZ"}),
        (
            "update_reservation_baggages",
            {
                "reservation_id": rid,
                "total_baggages": res["total_baggages"] + 1,
                "nonfree_baggages": res["nonfree_baggages"] + 1,
                "payment_id": card,
            },
        ),
        (
            "update_reservation_flights",
            {
                "reservation_id": rid,
                "cabin": res["cabin"],
                "flights": [
                    {"flight_number": f["flight_number"], "date": f["date"]} for f in res["flights"]
                ],
                "payment_id": card,
            },
        ),
        (
            "update_reservation_passengers",
            {
                "reservation_id": rid,
                "passengers": [{"first_name": "Ada", "last_name": "Byron", "dob": "1990-01-01"}]
                * len(res["passengers"]),
            },
        ),
        ("update_reservation_passengers", {"reservation_id": rid, "passengers": []}),
        ("transfer_to_human_agents", {"summary": "The user wants a human."}),
    ]


@lru_cache(maxsize=1)
def _world_samples() -> tuple[dict[str, Any], ...]:
    state = generate_world(3, n_users=12, n_flights=40, n_reservations=30)
    env = AirlineEnv(state)
    samples = []
    for step, (tool, arguments) in enumerate(_calls(state)):
        before = slice_for(env.state, tool, arguments)
        on_slice = AirlineEnv(deepcopy(before))
        observation = on_slice.execute(tool, arguments)
        assert env.execute(tool, arguments) == observation  # the slice decides the call
        delta = diff(before, on_slice.state)
        labels = step_labels(observation, delta, arguments, task_id="t0", env_id=ENV_ID)
        samples.append(
            {
                "id": f"{ENV_ID}/t0/{step:02d}",
                "env_id": ENV_ID,
                "task_id": "t0",
                "user_id": None,
                "step": step,
                "tool": tool,
                "arguments": arguments,
                "state_before": before,
                "observation": observation,
                "delta": delta,
                "state_after": apply(delta, before),
                "labels": labels,
            }
        )
    return tuple(samples)


@pytest.fixture()
def samples() -> list[dict[str, Any]]:
    return deepcopy(list(_world_samples()))


def test_the_samples_cover_every_outcome(samples: list[dict[str, Any]]) -> None:
    groups = {s["labels"]["group"] for s in samples}
    assert {"Failure", "No-Change", "Simple", "Medium"} <= groups
    ops = [op["op"] for s in samples for op in s["delta"]]
    assert {"add", "replace", "remove"} <= set(ops)  # the certificate booking removes one
    sizes = {s["labels"]["delta_size"] for s in samples}
    assert max(sizes) >= 3 and 0 in sizes
    writes_without_change = [
        s for s in samples if s["tool"] == "update_reservation_flights" and not s["delta"]
    ]
    assert writes_without_change


# --- library: fake predictors ----------------------------------------------------------------


async def _perfect(sample: dict[str, Any]) -> str:
    return render_prediction(sample["observation"], sample["delta"])


def test_a_perfect_predictor_scores_everything(samples: list[dict[str, Any]]) -> None:
    report = evaluate(samples, _perfect, concurrency=3)
    overall = report.overall
    assert overall.n == len(samples) and overall.failed == 0
    assert overall.feedback_match == overall.config_match == overall.n
    # the lenient metric misses exactly the samples whose delta removes something
    removes = [s["id"] for s in samples if any(op["op"] == "remove" for op in s["delta"])]
    assert removes
    assert overall.lenient_config_match == overall.n - len(removes)
    assert overall.strict_only == len(removes)
    assert [r.id for r in report.results] == [s["id"] for s in samples]  # input order


def test_extra_invented_changes_pass_only_the_lenient_metric(
    samples: list[dict[str, Any]],
) -> None:
    async def inventive(sample: dict[str, Any]) -> str:
        extra = {"op": "add", "path": "/users/ghost_0000", "after": {"name": "ghost"}}
        return render_prediction(sample["observation"], [*sample["delta"], extra])

    report = evaluate(samples, inventive)
    overall = report.overall
    assert overall.config_match == 0
    assert overall.feedback_match == overall.n
    assert overall.lenient_only == overall.lenient_config_match > 0


def test_failed_predictions_are_misses_and_listed(samples: list[dict[str, Any]]) -> None:
    async def flaky(sample: dict[str, Any]) -> str:
        if sample["step"] % 3 == 0:
            raise LLMServerError("endpoint down")
        if sample["step"] % 3 == 1:
            return "I think the tool would say something."
        return await _perfect(sample)

    report = evaluate(samples, flaky, concurrency=4)
    failed = {f["id"]: f["reason"] for f in report.failures()}
    assert len(failed) == report.overall.failed
    for sample in samples:
        reason = failed.get(sample["id"])
        assert (
            reason
            == {0: "llm_server_error", 1: "unparsable_completion", 2: None}[sample["step"] % 3]
        )
    assert report.overall.feedback_match == len(samples) - len(failed)
    assert all(f["stage"] == "predict" for f in report.failures())


def test_the_predictor_may_raise_a_repair_error_itself(samples: list[dict[str, Any]]) -> None:
    async def refuses(sample: dict[str, Any]) -> str:
        raise RepairError("unparsable_completion", "nothing usable")

    report = evaluate(samples[:2], refuses)
    assert [f["reason"] for f in report.failures()] == ["unparsable_completion"] * 2


def test_invalid_records_are_listed_not_scored(samples: list[dict[str, Any]]) -> None:
    broken = dict(samples[0], id="no-state")
    del broken["state_before"]
    stale = dict(samples[11], id="stale", state_after=samples[0]["state_before"])
    report = evaluate([broken, samples[1], "not a sample", stale], _perfect)
    assert [r.id for r in report.results] == [samples[1]["id"]]
    assert [(i["id"], i["reason"]) for i in report.invalid] == [
        ("no-state", "bad_step_sample"),
        ("#2", "bad_step_sample"),
        ("stale", "bad_step_sample"),
    ]
    assert {f["stage"] for f in report.failures()} == {"input"}


def test_breakdowns_and_report_shape(samples: list[dict[str, Any]]) -> None:
    report = evaluate(samples, _perfect)
    body = report.to_dict()
    json.dumps(body)  # JSON-ready
    assert body["samples"] == len(samples)
    assert list(body["by_group"]) == [
        g for g in ("Failure", "No-Change", "Simple", "Medium") if g in body["by_group"]
    ]
    assert sum(t["n"] for t in body["by_delta_size"].values()) == len(samples)
    assert body["by_arg_cardinality"]["0"]["n"] == 1  # list_all_airports
    assert body["overall"]["rates"]["config_match"] == 1.0
    table = report.table()
    assert "overall" in table and "group Failure" in table and "|Δ| 0" in table


def test_concurrency_is_bounded(samples: list[dict[str, Any]]) -> None:
    running = peak = 0

    async def slow(sample: dict[str, Any]) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return await _perfect(sample)

    evaluate(samples, slow, concurrency=3)
    assert peak == 3


def test_bad_concurrency_is_a_config_error() -> None:
    with pytest.raises(Exception, match="at least 1"):
        evaluate([], _perfect, concurrency=0)


# --- the devserver as the simulator ----------------------------------------------------------


def _client(url: str, attempts: int = 3) -> LLMClient:
    return LLMClient(
        EndpointPool([Endpoint(base_url=url)]),
        "factory-dev",
        {"temperature": 0.0},
        concurrency=8,
        timeout_s=20,
        retry=RetryPolicy(max_attempts=attempts, base_delay=0.01, max_delay=0.05),
        price=None,
        client_factory=sdk_transport,
    )


def _tools() -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = json.loads(
        get_plugin("airline").pack.tools.read_text(encoding="utf-8")
    )  # type: ignore[union-attr]
    return tools


def _against(
    server: DevServer, samples: list[dict[str, Any]], *, code: bool = False, attempts: int = 3
) -> EvalReport:
    async def run() -> EvalReport:
        async with _client(server.url, attempts) as client:
            predict = llm_predictor(
                client, _tools(), code=tool_sources("airline") if code else None
            )
            return await evaluate_async(samples, predict, concurrency=6)

    return asyncio.run(run())


@pytest.mark.parametrize("code", [False, True])
def test_the_devserver_is_a_perfect_simulator(
    devserver: Any, samples: list[dict[str, Any]], code: bool
) -> None:
    server = devserver(fence_rate=0.5)
    report = _against(server, samples, code=code)
    overall = report.overall
    assert overall.failed == 0, report.failures()
    assert overall.n == len(samples)
    assert overall.feedback_match == overall.config_match == overall.n
    assert server.stats()["by_kind"] == {"simulate": len(samples)}
    assert server.stats()["sim_dropped_changes"] == 0


def test_a_dropped_change_fails_config_match_exactly_where_something_changed(
    devserver: Any, samples: list[dict[str, Any]]
) -> None:
    server = devserver(sim_drop_change=1.0)
    report = _against(server, samples)
    changed = {s["id"] for s in samples if s["delta"]}
    assert changed and len(changed) < len(samples)
    assert {r.id for r in report.results if not r.config_match} == changed
    assert {r.id for r in report.results if not r.lenient_config_match} == changed
    assert report.overall.feedback_match == len(samples)
    assert server.stats()["sim_dropped_changes"] == len(changed)


def test_malformed_answers_are_listed_as_unparsable(
    devserver: Any, samples: list[dict[str, Any]]
) -> None:
    server = devserver(defects={"malformed_json": 0.5}, seed=4)
    report = _against(server, samples)
    failures = report.failures()
    assert failures, "the seed should break at least one answer beyond repair"
    assert {f["reason"] for f in failures} == {"unparsable_completion"}
    scored = [r for r in report.results if r.reason is None]
    assert all(r.feedback_match and r.config_match for r in scored)


def test_an_endpoint_that_always_fails_gives_llm_failures(
    devserver: Any, samples: list[dict[str, Any]]
) -> None:
    server = devserver(defects={"server_error": 1.0})
    report = _against(server, samples[:3], attempts=1)
    assert [f["reason"] for f in report.failures()] == ["llm_server_error"] * 3
    assert report.overall.feedback_match == 0


# --- CLI -------------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    nested = ("arguments", "state_before", "state_after", "delta", "labels")
    flat = [{k: json.dumps(v) if k in nested else v for k, v in r.items()} for r in rows]
    pq.write_table(pa.Table.from_pylist(flat), path)
    return path


@pytest.mark.parametrize("container", ["jsonl", "parquet"])
def test_cli_end_to_end(
    devserver: Any,
    samples: list[dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    container: str,
) -> None:
    server = devserver()
    write = _write_jsonl if container == "jsonl" else _write_parquet
    path = write(tmp_path / f"steps.{container}", samples)
    out = tmp_path / "out"
    argv = [
        "--samples",
        str(path),
        "--base-url",
        server.url,
        "--model",
        "factory-dev",
        "--domain",
        "airline",
        "--out",
        str(out),
        "--concurrency",
        "4",
        "--with-code",
    ]
    assert main(argv) == 0
    body = json.loads((out / "evaluation.json").read_text())
    assert body["samples"] == len(samples)
    assert body["model"] == "factory-dev" and body["with_code"] is True
    rates = body["overall"]["rates"]
    assert rates["feedback_match"] == rates["config_match"] == 1.0
    assert rates["lenient_config_match"] < 1.0  # the certificate booking deletes
    assert (out / "failures.jsonl").read_text() == ""
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in results] == [s["id"] for s in samples]
    stdout = capsys.readouterr().out
    assert "overall" in stdout and "100.0%" in stdout


def test_cli_with_a_recipe(devserver: Any, samples: list[dict[str, Any]], tmp_path: Path) -> None:
    server = devserver(sim_drop_change=1.0)
    path = _write_jsonl(tmp_path / "steps.jsonl", samples)
    out = tmp_path / "out"
    argv = [
        "--samples", str(path), "--recipe", str(ROOT / "pipelines" / "airline.yaml"),
        "--set", f'llm.endpoints=[{{"base_url": "{server.url}"}}]',
        "--set", "llm.model=factory-dev", "--set", "llm.retry.base_delay_s=0.01",
        "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    body = json.loads((out / "evaluation.json").read_text())
    assert body["model"] == "factory-dev"
    changed = sum(1 for s in samples if s["delta"])
    assert body["overall"]["config_match"] == len(samples) - changed
    assert body["overall"]["feedback_match"] == len(samples)


def test_cli_lists_bad_lines_and_honours_limit(
    devserver: Any, samples: list[dict[str, Any]], tmp_path: Path
) -> None:
    server = devserver()
    path = _write_jsonl(tmp_path / "steps.jsonl", ["{not json", *samples[:4], {"id": "x"}])
    out = tmp_path / "out"
    argv = [
        "--samples",
        str(path),
        "--base-url",
        server.url,
        "--model",
        "factory-dev",
        "--domain",
        "airline",
        "--out",
        str(out),
        "--limit",
        "3",
    ]
    assert main(argv) == 0
    body = json.loads((out / "evaluation.json").read_text())
    assert body["samples"] == 3 and body["invalid_records"] == 1
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert failures == [
        {
            "id": f"{path}:0",
            "reason": "invalid_json",
            "message": failures[0]["message"],
            "stage": "input",
        }
    ]


def test_cli_exit_codes(devserver: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_jsonl(tmp_path / "steps.jsonl", [{"id": "x"}])
    assert main(["--samples", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "--base-url" in capsys.readouterr().err
    assert main(["--samples", str(path), "--set", "llm.model=x", "--base-url", "http://h/v1"]) == 2
    server = devserver()
    rest = ["--base-url", server.url, "--model", "m", "--domain", "airline"]
    rest += ["--out", str(tmp_path / "o")]
    assert main(["--samples", str(path), *rest]) == 3  # nothing to score
    assert main(["--samples", str(tmp_path / "missing.jsonl"), *rest]) == 2
    assert main(["--samples", str(path), *rest, "--limit", "0"]) == 2


def test_samples_round_trip_through_the_devserver_prompt(samples: list[dict[str, Any]]) -> None:
    """The prompt carries everything the perfect simulator needs (no hidden channel)."""
    from factory.devserver import simulate
    from factory.envsim.simulator import simulation_messages

    specs = {t["name"]: t for t in _tools()}
    for sample in samples:
        spec = specs.get(sample["tool"], {"name": sample["tool"], "parameters": {}})
        text = simulation_messages(sample, spec)[1]["content"]
        read = simulate.read_simulation(text)
        assert read is not None
        answer = simulate.simulate_call(*read)
        assert answer is not None
        assert answer["feedback"] == sample["observation"]
        assert same_json(answer["config_changes"], sample["delta"])


def test_the_domain_of_a_job_folder_comes_from_its_run_json(tmp_path: Path) -> None:
    """With several domains registered, samples inside a job's output folder name their
    domain through the job's ``run.json``; loose files need ``--domain``."""
    from factory.errors import ConfigError
    from factory.evaluate import default_domain

    job = tmp_path / "job"
    (job / "heldout").mkdir(parents=True)
    (job / "run.json").write_text(json.dumps({"recipe": {"domain": {"name": "retail"}}}))
    assert default_domain(None, str(job / "heldout")) == "retail"
    assert default_domain(None, str(job / "heldout" / "part-0.parquet")) == "retail"
    assert default_domain("airline", str(job / "heldout")) == "airline"
    with pytest.raises(ConfigError, match="give --domain"):
        default_domain(None, str(tmp_path / "loose.jsonl"))
