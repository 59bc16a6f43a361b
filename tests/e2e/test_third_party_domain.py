"""A domain from another package runs everywhere a shipped one does (issue 23, point 2).

``tests/domains/library`` is a separate distribution (``factory-library``: its own
``pyproject.toml``, three tools over a generated library, its pack as package data, one
entry point in ``factory.domains``), installed into the test venv by the README's install
command. Nothing in ``factory/`` names it: the amplify job (grounded, against the
development server's generic oracle), the envsim job (the factory's default slicing),
fidelity replay and ``simenv serve`` all find it through the registry.
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from factory.core.trajectory import Trajectory
from factory.devserver.simulate import read_simulation, simulate_call
from factory.engine.runner import run
from factory.envs.registry import available_domains, generate_environment
from factory.envsim.fidelity import main as fidelity_main
from factory.envsim.simulator import parse_prediction
from factory.io.readers import read_seeds
from factory.recipe import load_recipe
from tests.helpers import assert_rows_valid, check_alpaca, dev_overrides, read_rows
from tests.helpers.served import Served, episode_steps

try:
    PACK = Path(str(resources.files("factory_library") / "pack"))
except ModuleNotFoundError:  # pragma: no cover - an install without the test domain
    pytest.fail(
        "the test domain factory-library is not installed: run the README's install command "
        "(it ends with pip install -e tests/domains/library)",
        pytrace=False,
    )


def test_the_amplify_and_envsim_jobs_run_on_a_third_party_domain(
    ray_session: Any, devserver: Any, tmp_path: Path
) -> None:
    assert "library" in available_domains("sampler")
    server = devserver()
    out = tmp_path / "amplify"
    cfg = load_recipe(
        PACK / "library.yaml", [f"output.dir={out}", *dev_overrides(server.url, target=12)]
    )
    result = run(cfg, out, progress=False)
    assert result.totals["accepted"] == 12
    manifest = json.loads((out / "manifest.json").read_text())
    # Grounded in the generated library: every call of every answer replays exactly.
    assert manifest["grounding"]["fidelity"] == 1.0 and manifest["grounding"]["calls"] > 12
    assert server.stats()["grounded_answers"] >= 12
    assert_rows_valid(cfg, read_rows(out))

    out = tmp_path / "envsim"
    result = run(
        load_recipe(PACK / "library-envsim.yaml", [f"output.dir={out}"]), out, progress=False
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mixture"]["shortfall"] == {}
    rows = check_alpaca(out)
    assert len(rows) == result.totals["accepted"] == 70
    for row in rows[::7]:  # the target is exact: the call re-run on the input's state
        state, name, arguments = read_simulation(row["input"])
        assert simulate_call(state, name, arguments) == parse_prediction(row["output"])


def test_fidelity_replay_of_the_third_party_seeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "db"
    db.mkdir()
    for table, records in generate_environment("library", 0).state.items():
        (db / f"{table}.json").write_text(json.dumps(records), encoding="utf-8")
    code = fidelity_main(
        ["--domain", "library", "--db", str(db), "--trajectories", str(PACK / "seeds.jsonl")]
    )
    assert code == 0
    assert capsys.readouterr().out.startswith("48/48 observations match (16 trajectories)")


def test_simenv_serve_plays_the_third_party_domain(tmp_path: Path) -> None:
    seeds = [t for t in read_seeds(PACK / "seeds.jsonl") if isinstance(t, Trajectory)]
    seed = next(t for t in seeds if "checkout_book" in [c.name for _, c in t.calls()])
    calls = [{"name": c.name, "arguments": c.arguments} for _, c in seed.calls()]
    served = Served(
        "--domain", "library", "--mode", "hybrid", "--world-seed", "0",
        "--seeds", str(PACK / "seeds.jsonl"), "--cache", str(tmp_path / "cache"),
    )  # fmt: skip
    try:
        steps = asyncio.run(episode_steps(served.url, f"seed-{seed.id}", calls))
    finally:
        code = served.stop()
    assert code == 0, served.lines
    assert not [line for line in served.lines if "Traceback" in line], served.lines
    recorded = [t.content for t in seed.turns if t.role == "tool"]
    observed = [s.observation.content for s in steps[1:] if s.observation.role == "tool"]
    assert observed == recorded  # executed on the generated library, as the seed was
    assert steps[-1].done and steps[-1].reward == 1.0
