"""The CLI: exit codes, messages, dry runs, recipe name resolution."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.run import main

from .conftest import ROOT


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_dry_run_from_repo_root_with_bare_name(monkeypatch, capsys) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["airline.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "seeds: 41 read, 41 valid, 0 rejected" in out
    assert "prefilter" in out and "amplify" in out and "estimated total cost" in out
    assert "--- example amplify prompt ---" in out and "### Reference trajectory" in out


def test_dry_run_json_plan_counts_seed_rejects(tmp_path: Path, capsys) -> None:
    seeds = tmp_path / "s.jsonl"
    good = (ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()[:3]
    seeds.write_text("\n".join([*good, "{broken", '{"messages": 3}']) + "\n")
    code = main(
        [
            str(ROOT / "pipelines/airline.yaml"),
            "--dry-run",
            "--json",
            "--set",
            f"seeds.path={seeds}",
            "--set",
            "amplify.target=30",
        ]
    )
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["seeds"] == {
        "read": 5,
        "valid": 3,
        "rejected": 2,
        "reasons": {"invalid_json": 1, "bad_field_type": 1},
    }
    amp = next(s for s in plan["stages"] if s["stage"] == "amplify")
    assert amp["calls"] == 34  # ceil(30 / expected_yield 0.9)
    assert amp["cost_usd"] > 0 and amp["cached_tokens"] > 0


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--set", "llm.temprature=1"], 2, "llm.temprature: unknown key"),
        (["--set", "amplify.target=-3"], 2, "amplify.target"),
        (["--set", "seeds.path=/nonexistent/*.jsonl"], 2, "seeds.path"),
        (["--set", "pipeline=bake"], 2, "pipeline: expected one of"),
        (["--set", "oops"], 2, "--set expects key.path=value"),
    ],
)
def test_config_errors_exit_2_naming_the_key(args, code, words, capsys) -> None:
    assert main([str(ROOT / "pipelines/airline.yaml"), "--dry-run", *args]) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1


def test_missing_recipe_exits_2(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["nope.yaml", "--dry-run"]) == 2
    assert "recipe not found" in capsys.readouterr().err


def test_real_provider_without_key_names_the_variable(ray_session, tmp_path, capsys) -> None:
    code = main(
        [
            str(ROOT / "pipelines/airline.yaml"),
            "-o",
            str(tmp_path),
            "--no-progress",
            "--set",
            "prefilter.enabled=false",
            "--set",
            "amplify.target=2",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "OPENAI_API_KEY" in err


@pytest.mark.ray
def test_no_usable_seed_exits_3(ray_session, tmp_path, capsys) -> None:
    seeds = tmp_path / "bad.jsonl"
    seeds.write_text('{"conversations": []}\n[1]\n')
    code = main(
        [
            str(ROOT / "pipelines/airline.yaml"),
            "-o",
            str(tmp_path / "o"),
            "--devserver",
            "--no-progress",
            "--set",
            f"seeds.path={seeds}",
        ]
    )
    assert code == 3
    assert "no seed survived" in capsys.readouterr().err
    assert len((tmp_path / "o/rejects/seeds/part-00000.jsonl").read_text().splitlines()) == 2
