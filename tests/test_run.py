"""The CLI: exit codes, messages, dry runs, recipe name resolution."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from factory.run import main
from tests.conftest import ROOT


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
    assert "--- example" not in out  # prompts only with --show-prompts
    assert main(["airline.yaml", "--dry-run", "--show-prompts"]) == 0
    shown = capsys.readouterr().out
    assert "--- example amplify prompt ---" in shown and "### Reference trajectory" in shown
    # the cost table ends the output, after the prompts, on the last screen
    assert shown.rstrip().splitlines()[-1].startswith("estimated total cost:")
    assert shown.index("--- example amplify prompt ---") < shown.index("stage      model")


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
            "-o",  # an empty folder: no earlier run's yield
            str(tmp_path / "o"),
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


def _paths_named(text: str) -> list[Path]:
    return [Path(p.rstrip(".,;:)")) for p in re.findall(r"(?:(?<=\s)|^)(/[^\s:;,]+)", text)]


@pytest.mark.ray
def test_no_usable_seed_exits_3_with_the_commonest_reasons(ray_session, tmp_path, capsys) -> None:
    lines = (ROOT / "seeds/airline/seeds.jsonl").read_text().splitlines()[:3]
    unknown_tool = []
    for line in lines[:2]:  # the first call names a tool the seed's tool list lacks
        record = json.loads(line)
        call = record["conversations"][1]
        call["value"] = call["value"].replace("get_user_details", "get_user_detailz")
        unknown_tool.append(json.dumps(record))
    seeds = tmp_path / "bad.jsonl"
    seeds.write_text("\n".join([*unknown_tool, "[1]"]) + "\n")
    code = main(
        [
            str(ROOT / "pipelines/airline.yaml"),
            "-o",
            str(tmp_path / "o"),
            "--devserver",
            "--no-progress",
            "--set",
            f"seeds.path={seeds}",
            "--set",
            "amplify.target=4",
        ]
    )
    err = capsys.readouterr().err
    assert code == 3
    error = next(line for line in err.splitlines() if line.startswith("error: "))
    assert error.startswith("error: no seed survived the checks: 3 read, 3 rejected, 0 failed")
    details = [line.strip() for line in err.split(error, 1)[1].strip().splitlines()]
    # The commonest reason first, each with one example: its seed source and message.
    assert details[0].startswith(f"validate:unknown_tool x2, e.g. {seeds}:0: ")
    assert "get_user_detailz" in details[0]
    assert details[1].startswith(f"parse:not_an_object x1, e.g. {seeds}:2: ")
    assert "Traceback" not in err and "(pid=" not in err
    named = _paths_named(error)
    assert tmp_path / "o/rejects/seeds" in named
    assert all(p.exists() for p in named), named
    assert len((tmp_path / "o/rejects/seeds/part-00000.jsonl").read_text().splitlines()) == 3


def _random_bytes(n: int) -> bytes:
    return random.Random(0).randbytes(n)


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("seeds.csv", b"conversations,system\nhi,you\n", "unsupported extension '.csv'"),
        ("empty.jsonl", b"", "empty"),
        ("random.jsonl", _random_bytes(3_000_000), "not text"),
        ("random.json", _random_bytes(100_000), "not text"),
        ("random.parquet", _random_bytes(100_000), "unreadable Parquet"),
        ("seeds.jsonl.gz", b"\x1f\x8b\x08" + _random_bytes(1000), "gzip"),
        ("zipped.jsonl", b"\x1f\x8b\x08" + _random_bytes(1000), "gzip"),
        ("rows.jsonl", b'{"prompt": "q", "completion": "a"}\n[1, 2]\n', "unknown_format"),
    ],
)
def test_unusable_seed_file_is_refused_before_ray(
    tmp_path: Path, capsys, name: str, data: bytes, words: str
) -> None:
    seeds = tmp_path / name
    seeds.write_bytes(data)
    # The dry run refuses the file as the run does.
    dry = [str(ROOT / "pipelines/airline.yaml"), "--dry-run", "--set", f"seeds.path={seeds}"]
    assert main(dry) == 3
    assert f"seeds.path: {seeds}: " in capsys.readouterr().err
    out = tmp_path / "o"
    code = main(
        [
            str(ROOT / "pipelines/airline.yaml"),
            "-o",
            str(out),
            "--devserver",
            "--no-progress",
            "--set",
            f"seeds.path={seeds}",
        ]
    )
    err = capsys.readouterr().err
    error = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 3, err
    assert len(error) == 1 and f"seeds.path: {seeds}: " in error[0] and words in error[0], err
    assert all(p.exists() for p in _paths_named(error[0]))
    assert not out.exists(), "refused before the output folder or Ray was touched"


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (("  target: 90000", "  targte: 90000"), "amplify.targte: unknown key; did you mean "
         "amplify.target? (amplify.target: missing required value)"),
        (("  model: gpt-5\n", "  modle: gpt-5\n"), "llm.modle: unknown key; did you mean "
         "llm.model? (llm.model: missing required value)"),
        (("output:", "outptu:"), "outptu: unknown key; did you mean output? "
         "(output: missing required value)"),
    ],
)  # fmt: skip
def test_misspelt_required_key_names_both_keys(tmp_path, capsys, edit, words) -> None:
    text = (ROOT / "pipelines/airline.yaml").read_text()
    assert edit[0] in text
    recipe = tmp_path / "airline.yaml"
    recipe.write_text(text.replace(edit[0], edit[1], 1).replace("../", f"{ROOT}/"))
    code = main([str(recipe), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err == f"error: {words}\n"


QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}


@pytest.mark.ray
def test_error_raised_in_a_ray_actor_is_one_line_and_ray_noise_is_in_the_log(tmp_path) -> None:
    """A FactoryError raised in an actor's constructor (a bad world size reaches the
    episode sampler only there) ends the run with its one line and exit code; Ray's
    start-up lines, C++ warnings and the worker's traceback are in OUT/logs/run.log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST"))}
    env.update(QUIET_ENV, RAY_TMPDIR=tempfile.mkdtemp(prefix="rq", dir="/tmp"))
    out = tmp_path / "o"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "factory.run",
            str(ROOT / "pipelines/airline-envsim.yaml"),
            "-o",
            str(out),
            "--no-progress",
            "--set",
            "envsim.world_sizes={n_userz: 3}",
            "--set",
            "envsim.episodes_per_round=4",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=500,
    )
    log = out / "logs" / "run.log"
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        f"log (Ray's messages, retries): {log}",
        "error: world_sizes: unknown world size(s) n_userz; known: first_date, n_days, "
        "n_flights, n_reservations, n_users",
    ], proc.stderr[-3000:]
    text = log.read_text()
    assert "Started a local Ray instance" in text  # Ray's INFO line, moved here
    assert "Traceback" in text and "n_userz" in text  # the worker's traceback, kept


@pytest.mark.ray
def test_progress_bar_tokens_and_wall_time_agree_with_the_manifest(
    ray_session, tmp_path, capsys
) -> None:
    import psutil

    out = tmp_path / "o"
    code = main(
        [
            str(ROOT / "pipelines/airline.yaml"),
            "-o",
            str(out),
            "--devserver",
            "--set",
            "amplify.target=12",
            "--set",
            "seeds.limit=6",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    tokens = manifest["tokens"]
    assert tokens["cached_tokens"] > 0  # the devserver reports cached prompt tokens
    bars = [s for s in re.split(r"[\r\n]", captured.err) if s.startswith("accepted:")]
    assert bars, captured.err[-2000:]
    # Cached tokens are a part of the prompt tokens: counted once, judge included.
    assert re.findall(r"tok=(\d+)", bars[-1]) == [
        str(tokens["prompt_tokens"] + tokens["completion_tokens"])
    ]
    # Without a terminal each bar is a plain line (the ETA rule is tests/engine/test_console's).
    assert re.match(r"accepted: 12/12 \(100%\), .*\(done\)$", bars[-1]), bars[-1]
    # One wall time: the summary's is the manifest's, counted from the process start.
    assert manifest["wall_time_from"] == "process start"
    started = psutil.Process().create_time()
    assert manifest["started_at"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    printed = re.search(r"^wall time: ([\d.]+)s \(since process start\)$", captured.out, re.M)
    assert printed and printed.group(1) == f"{manifest['wall_time_s']:.1f}"
