"""Before the first paid call: keys, endpoints, the plan, and the question on a terminal."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from factory import preflight
from factory.engine.plan import StagePlan
from factory.errors import ConfigError, UnreachableError
from factory.recipe import load_recipe
from factory.run import main
from tests.conftest import ROOT
from tests.helpers import free_port

AIRLINE = ROOT / "pipelines" / "airline.yaml"


def _cfg(*overrides: str) -> Any:
    return load_recipe(AIRLINE, list(overrides))


def _stage(model: str, calls: int, cost: float | None) -> StagePlan:
    return StagePlan("amplify", model, calls, 1000 * calls, 800 * calls, 100 * calls, cost, cost)


@pytest.mark.parametrize(
    ("cost", "threshold", "interactive", "yes", "paid", "asks"),
    [
        (954.0, 25.0, True, False, True, True),  # the shipped recipe at a terminal
        (954.0, 25.0, False, False, True, False),  # ray job submit: no terminal, no question
        (954.0, 25.0, True, True, True, False),  # --yes
        (954.0, 25.0, True, False, False, False),  # the development server: nothing is paid
        (954.0, None, True, False, True, False),  # confirm_above_usd: null
        (2.0, 25.0, True, False, True, False),  # below the threshold
        (25.0, 25.0, True, False, True, False),  # at it
        (None, 25.0, True, False, True, False),  # unpriced: no estimate to confirm
    ],
)
def test_the_decision_to_ask(cost, threshold, interactive, yes, paid, asks) -> None:
    assert (
        preflight.needs_confirmation(cost, threshold, interactive=interactive, yes=yes, paid=paid)
        is asks
    )


def test_the_plan_names_calls_tokens_cost_what_was_paid_and_the_cap() -> None:
    stages = [_stage("o4-mini", 41, 0.12), _stage("gpt-5", 100_000, 953.55)]
    stages[0].stage = "prefilter"
    est = preflight.estimate(stages)
    assert est.calls == 100_041 and est.cost_usd == pytest.approx(953.67)
    batched = preflight.estimate(
        [replace(s, batch_cost_usd=s.cost_usd / 2) for s in stages], batch=True
    )
    assert batched.cost_usd == pytest.approx(476.835)
    assert "(batch API prices" in preflight.plan_lines(batched, _cfg(), preflight.Prior())[1]
    prior = preflight.Prior(cached={"amplify": (500, 5.0)}, resumes="it did not end")
    left = preflight.left_to_pay(stages, prior)
    assert left[0] == 41 + 99_500 and left[1] == pytest.approx(0.12 + 953.55 * 0.995)
    lines = preflight.plan_lines(est, _cfg(), prior, left=left, out_dir=Path("/o"))
    text = "\n".join(lines)
    assert "plan: 100,041 LLM calls, 100.0 M prompt tokens (80.0 M of them cached)" in text
    assert "estimated cost: 953.67 USD" in text
    assert "resuming the run in /o: it did not end" in text
    assert "already paid in this folder: 5.00 USD for 500 answers in its response cache" in text
    assert "left to pay: 99,541 of the 100,041 calls, about 948.90 USD" in text
    assert "cap: amplify.max_cost_usd = 2,000.00 USD" in text
    assert preflight.question(948.89, prior) == (
        "Resume this run? What is left to pay may cost about 948.89 USD (5.00 USD already "
        "paid). [y/N] "
    )
    assert preflight.question(953.67, preflight.Prior()) == (
        "Start this run? It may cost about 953.67 USD. [y/N] "
    )
    # more answers cached than planned: nothing left of that stage
    assert preflight.left_to_pay(stages, preflight.Prior(cached={"amplify": (200_000, 1.0)}))[
        1
    ] == pytest.approx(0.12)
    # a mixed recipe's parts share the cache's amplify answers
    parts = [
        replace(stages[1], stage="amplify/airline"),
        replace(stages[1], stage="amplify/retail"),
    ]
    assert preflight.left_to_pay(parts, preflight.Prior(cached={"amplify": (100_000, 1.0)})) == (
        100_000,
        pytest.approx(953.55),
    )
    bare = "\n".join(
        preflight.plan_lines(est, _cfg("amplify.max_cost_usd=null"), preflight.Prior())
    )
    assert "cap: none (set amplify.max_cost_usd" in bare and "already paid" not in bare
    assert "resuming" not in bare
    unpriced = preflight.estimate([_stage("my-model", 10, None)])
    assert unpriced.cost_usd is None and unpriced.unpriced == ("my-model",)
    assert preflight.left_to_pay([_stage("my-model", 10, None)], preflight.Prior()) == (10, None)
    text = "\n".join(preflight.plan_lines(unpriced, _cfg(), preflight.Prior(), devserver=True))
    assert "my-model has no price" in text and "development server: nothing is paid" in text


def _cache_answers(folder: Path, stage: str, n: int, usd: float) -> None:
    from factory.io.cache import ResponseCache

    with ResponseCache(folder) as cache:
        for i in range(n):
            cache.put(f"{stage}-{i:032x}", {"attempts": 1, "cost_usd": usd, "text": '"cost_usd":9'})


def test_an_earlier_run_of_the_folder_is_read_from_its_state_and_its_cache(tmp_path: Path) -> None:
    # Issue 39: an interrupted run leaves no manifest; its answers are in the cache.
    cfg = _cfg("amplify.target=200")
    kw = {"fresh": False, "drop_cache": False, "retry_failed": False}
    assert preflight.prior_run(tmp_path / "new", cfg, **kw) == preflight.Prior()
    state = {"status": "running", "recipe": {"amplify": {"target": 200}}}
    (tmp_path / "run.json").write_text(json.dumps(state))
    _cache_answers(tmp_path / "cache", "amplify", 105, 0.25)
    _cache_answers(tmp_path / "cache", "prefilter", 41, 0.001)
    prior = preflight.prior_run(tmp_path, cfg, **kw)
    assert prior.cached == {
        "amplify": (105, pytest.approx(26.25)),
        "prefilter": (41, pytest.approx(0.041)),
    }
    assert prior.answers == 146 and prior.cost_usd == pytest.approx(26.291)
    assert prior.resumes == "it did not end (interrupted, killed or crashed)"
    assert not prior.finished
    state = {**state, "status": "stopped", "stopped_by": "max_cost_usd"}
    (tmp_path / "run.json").write_text(json.dumps(state))
    assert preflight.prior_run(tmp_path, cfg, **kw).resumes == "it was stopped (max_cost_usd)"
    (tmp_path / "run.json").write_text(json.dumps({**state, "status": "done"}))
    done = preflight.prior_run(tmp_path, cfg, **kw)
    assert done.finished and done.resumes is None
    extended = preflight.prior_run(tmp_path, _cfg("amplify.target=300"), **kw)
    assert not extended.finished and "amplify.target changed from 200 to 300" in (
        extended.resumes or ""
    )
    retried = preflight.prior_run(tmp_path, cfg, **{**kw, "retry_failed": True})
    assert not retried.finished and "--retry-failed" in (retried.resumes or "")
    # --fresh starts over but keeps the cache: its answers are still free
    fresh = preflight.prior_run(tmp_path, cfg, **{**kw, "fresh": True})
    assert fresh.resumes is None and fresh.answers == 146
    assert preflight.prior_run(tmp_path, cfg, **{**kw, "drop_cache": True}).answers == 0
    assert preflight.prior_run(tmp_path, _cfg("cache.enabled=false"), **kw).answers == 0
    # A stage whose prompts changed since gets none of its answers again.
    from factory.engine.prompts import prompt_fingerprints

    prints = prompt_fingerprints(cfg)
    (tmp_path / "prompts.json").write_text(json.dumps({**prints, "amplify": "edited"}))
    assert preflight.prior_run(tmp_path, cfg, **kw).cached == {
        "prefilter": (41, pytest.approx(0.041))
    }


def test_the_yield_of_the_folders_last_run_is_measured(tmp_path: Path) -> None:
    cfg = _cfg()
    assert preflight.measured(tmp_path, cfg) is None
    totals = {"total": 173, "accepted": 100, "surplus": 9, "rejected": 64, "failed": 0}
    (tmp_path / "run.json").write_text(json.dumps({"status": "done", "totals": totals}))
    assert preflight.measured(tmp_path, cfg) == (109, 173)
    (tmp_path / "run.json").write_text(json.dumps({"status": "running"}))  # interrupted
    assert preflight.measured(tmp_path, cfg) is None


def test_a_missing_key_is_named_before_anything_starts(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        preflight.check_keys(_cfg())
    out = tmp_path / "o"
    assert main([str(AIRLINE), "-o", str(out)]) == 2  # no Ray here: the guard would fail it
    err = capsys.readouterr().err
    assert "export OPENAI_API_KEY" in err and not out.exists()


def test_endpoints_are_connected_to_before_ray(capsys, tmp_path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with socket.socket() as live:
        live.bind(("127.0.0.1", 0))
        live.listen()
        alive = f"http://127.0.0.1:{live.getsockname()[1]}/v1"
        endpoints = json.dumps([{"base_url": alive}, {"base_url": dead}])
        warned = preflight.check_endpoints(_cfg(f"llm.endpoints={endpoints}"))
    assert len(warned) == 1 and "llm.endpoints.1.base_url" in warned[0]
    assert "connection refused" in warned[0]
    with pytest.raises(UnreachableError, match=r"no LLM endpoint answers: llm.endpoints.0"):
        preflight.check_endpoints(_cfg(f'llm.endpoints=[{{"base_url": "{dead}"}}]'))
    assert preflight.host_port("https://api.openai.com/v1") == ("api.openai.com", 443)
    assert preflight.check_endpoints(_cfg("llm.serve={}")) == []  # the run starts its own
    out = tmp_path / "o"
    args = [str(AIRLINE), "-o", str(out), "--set", f"llm.endpoints.0.base_url={dead}"]
    assert main([*args, "--set", "llm.endpoints.0.api_key_env=null"]) == 8
    err = capsys.readouterr().err
    assert err.startswith("error: no LLM endpoint answers") and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.fixture()
def local_endpoint(tmp_path: Path):
    """Something listening on 127.0.0.1 for the connect check; the run itself is faked."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def _paid_run(out: Path, endpoint: str, *extra: str) -> list[str]:
    return [str(AIRLINE), "-o", str(out), "--no-progress", "--set",
            f"llm.endpoints.0.base_url={endpoint}", "--set", "llm.endpoints.0.api_key_env=null",
            *extra]  # fmt: skip


def test_a_terminal_is_asked_and_no_means_nothing_starts(
    local_endpoint, tmp_path, monkeypatch, capsys
) -> None:
    import factory.engine.runner

    asked: list[str] = []
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "n")
    monkeypatch.setattr(factory.engine.runner, "run", lambda *a, **k: pytest.fail("started"))
    out = tmp_path / "o"
    assert main(_paid_run(out, local_endpoint)) == 5
    printed = capsys.readouterr().out
    assert asked == ["Start this run? It may cost about 954.77 USD. [y/N] "]
    assert "estimated cost: 954.77 USD" in printed and "cap: amplify.max_cost_usd" in printed
    assert "not started: nothing was called or written" in printed and not out.exists()
    # --confirm-above raises the threshold: nothing to ask below it
    asked.clear()
    monkeypatch.setattr(factory.engine.runner, "run", _FakeRun())
    assert main(_paid_run(out, local_endpoint, "--confirm-above", "1000")) == 0
    assert asked == []


def test_a_resume_says_so_and_asks_about_what_is_left_to_pay(
    local_endpoint, tmp_path, monkeypatch, capsys
) -> None:
    """Issue 39: a gpt-5 run interrupted after 105 answers showed a fresh run's plan and
    asked about the whole cost."""
    import factory.engine.runner

    out = tmp_path / "o"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"status": "running", "recipe": {}}))
    _cache_answers(out / "cache", "amplify", 105, 0.4)
    asked: list[str] = []
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "n")
    monkeypatch.setattr(factory.engine.runner, "run", lambda *a, **k: pytest.fail("started"))
    assert main(_paid_run(out, local_endpoint)) == 5
    printed = capsys.readouterr().out
    assert f"resuming the run in {out}: it did not end" in printed
    assert "already paid in this folder: 42.00 USD for 105 answers" in printed
    assert "left to pay: 99,936 of the 100,041 calls, about " in printed
    assert len(asked) == 1 and asked[0].startswith("Resume this run? What is left to pay may")
    left = float(asked[0].split("cost about ")[1].split(" USD")[0].replace(",", ""))
    assert 953.0 < left < 954.0 and asked[0].endswith("(42.00 USD already paid). [y/N] ")


class _FakeRun:
    """Stands in for the engine behind the CLI: records that it was reached."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, cfg: Any, out_dir: Path, **kw: Any) -> Any:
        from factory.engine.result import RunResult

        self.calls += 1
        return RunResult(out_dir, {"total": 0, "accepted": 0}, {})


def test_without_a_terminal_the_plan_is_printed_and_the_run_starts(
    local_endpoint, tmp_path, monkeypatch, capsys
) -> None:
    import factory.engine.runner

    fake = _FakeRun()
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    monkeypatch.setattr("builtins.input", lambda prompt: pytest.fail("asked without a terminal"))
    monkeypatch.setattr(factory.engine.runner, "run", fake)
    assert main(_paid_run(tmp_path / "o", local_endpoint)) == 0
    printed = capsys.readouterr().out
    assert fake.calls == 1
    assert printed.index("estimated cost: 954.77 USD") < printed.index("output:")
    assert "no terminal to ask: starting" in printed and "caps above bound the spend" in printed
