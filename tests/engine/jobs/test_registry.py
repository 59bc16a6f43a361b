"""From a recipe's job kind to its job (``factory.engine.jobs.registry``): the runner
knows no kind, and every kind's entry is the one the recipe declares."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from factory.engine.jobs import registry
from factory.engine.jobs.mix import run_mix
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
    entry = registry.JOBS[kind]
    assert (entry.job is None) == (kind is MixRecipe)
    bound = registry.composite(cfg)
    assert (bound.func if bound is not None else None) is (run_mix if kind is MixRecipe else None)  # type: ignore[attr-defined]


def test_a_mixed_recipe_is_not_declared_as_one_job(tmp_path: Path) -> None:
    """Its parts run as jobs of their own (``run_mix``): declaring it whole is refused."""
    cfg = load_recipe(ROOT / "pipelines" / "mixed.yaml")
    with pytest.raises(ConfigError) as info:
        registry.declare(cfg, tmp_path, None, lambda name, specs: None)  # type: ignore[arg-type]
    assert info.value.key_path == "parts"


def test_the_runner_tells_no_job_kind_apart_and_reads_nothing_off_a_job() -> None:
    """Kinds are the registry's (issue 34): no ``pipeline`` comparison, no ``parts`` test,
    no job module import and no ``getattr`` on a job in the runner."""
    text = (ROOT / "factory" / "engine" / "runner.py").read_text(encoding="utf-8")
    assert not re.search(r"\.pipeline\s*[!=]=|\.parts\b|getattr\(job", text)
    assert not re.search(r"from factory\.engine\.jobs\.(amplify|curate|envsim|mix)", text)
