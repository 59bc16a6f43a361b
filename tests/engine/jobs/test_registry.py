"""From a recipe's job kind to its job (``factory.engine.jobs.registry``): the runner
knows no kind, and every kind's entry is the one the recipe declares."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from factory.engine.jobs import registry
from factory.engine.jobs.mix import MixJob
from factory.engine.result import new_manifest
from factory.errors import ConfigError
from factory.recipe import AmplifyRecipe, CurateRecipe, EnvsimRecipe, MixRecipe, load_recipe
from tests.conftest import ROOT


@pytest.mark.parametrize(
    ("recipe", "kind"),
    [
        ("airline.yaml", AmplifyRecipe),
        ("mixed.yaml", MixRecipe),
        ("airline-seeds.yaml", CurateRecipe),
        ("airline-envsim.yaml", EnvsimRecipe),
    ],
)
def test_each_shipped_recipe_has_the_job_of_its_kind(recipe: str, kind: type) -> None:
    cfg = load_recipe(ROOT / "pipelines" / recipe)
    assert type(cfg) is kind
    assert set(registry.JOBS) == {AmplifyRecipe, MixRecipe, CurateRecipe, EnvsimRecipe}
    assert callable(registry.JOBS[kind].job)


def test_a_mixed_recipe_is_one_job_of_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its parts run inside one job (``MixJob``): the first part's chains under its own
    names, the run-wide caps, its part folder prepared; later parts start as it runs."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # declaring opens no connection
    cfg = load_recipe(ROOT / "pipelines" / "mixed.yaml", ["amplify.max_calls=1000"])
    chains: list[str] = []
    job = registry.declare(
        cfg, tmp_path, new_manifest(cfg), lambda name, specs: chains.append(name)
    )
    assert isinstance(job, MixJob) and job.pipeline == "amplify"
    assert list(job.chains) == ["seeds/airline"] and chains == []
    assert job.caps.max_calls == 1000
    assert not job.planner.finished
    assert (tmp_path / "parts" / "airline").is_dir() and not (
        tmp_path / "parts" / "retail"
    ).exists()


def test_an_unknown_recipe_type_is_refused(tmp_path: Path) -> None:
    cfg = load_recipe(ROOT / "pipelines" / "airline.yaml")
    with pytest.raises(ConfigError) as info:
        registry.declare(object(), tmp_path, new_manifest(cfg), lambda name, specs: None)  # type: ignore[arg-type]
    assert info.value.key_path == "pipeline"


def test_the_runner_tells_no_job_kind_apart_and_reads_nothing_off_a_job() -> None:
    """Kinds are the registry's (issue 34): no ``pipeline`` comparison, no ``parts`` test,
    no job module import and no ``getattr`` on a job in the runner."""
    text = (ROOT / "factory" / "engine" / "runner.py").read_text(encoding="utf-8")
    assert not re.search(r"\.pipeline\s*[!=]=|\.parts\b|getattr\(job", text)
    assert not re.search(r"from factory\.engine\.jobs\.(amplify|curate|envsim|mix)", text)
