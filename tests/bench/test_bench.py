"""``factory.bench`` takes its recipe and seeds from ``--recipe``, never from a domain's name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.bench import default_recipe, main, make_seeds
from factory.errors import EXIT_CONFIG, ConfigError
from tests.conftest import ROOT


def _recipe_copy(folder: Path, name: str, seeds: Path) -> Path:
    """The shipped amplify recipe, moved to ``folder`` and reading ``seeds``."""
    text = (ROOT / "pipelines/airline.yaml").read_text(encoding="utf-8")
    text = text.replace("../prompts/", f"{ROOT}/prompts/").replace(
        "../filters/", f"{ROOT}/filters/"
    )
    text = text.replace("../seeds/airline/*.jsonl", str(seeds))
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_default_recipe_is_the_one_shipped_amplify_recipe() -> None:
    assert default_recipe() == ROOT / "pipelines/airline.yaml"


def test_of_several_amplify_recipes_the_first_by_name_is_timed(tmp_path: Path) -> None:
    seeds = ROOT / "seeds/airline/seeds.jsonl"
    for name in ("two.yaml", "one.yaml"):
        _recipe_copy(tmp_path, name, seeds)
    assert default_recipe(tmp_path) == tmp_path / "one.yaml"
    with pytest.raises(ConfigError, match="pass --recipe: no online amplify recipe"):
        default_recipe(tmp_path / "empty")


def test_bench_seeds_come_from_the_recipe(tmp_path: Path) -> None:
    shipped = (ROOT / "seeds/airline/seeds.jsonl").read_text(encoding="utf-8").splitlines()
    mine = tmp_path / "mine.jsonl"
    mine.write_text("\n".join(shipped[:2]) + "\n", encoding="utf-8")
    recipe = _recipe_copy(tmp_path, "mine.yaml", mine)

    out = make_seeds(3, tmp_path / "bench.jsonl", recipe=recipe)

    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows[:2] == [json.loads(line) for line in shipped[:2]]
    assert len(rows) == 3 and rows[2] not in rows[:2]  # a renamed variant of the first


def test_unknown_recipe_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["amplify", "--recipe", "no-such-recipe.yaml"]) == EXIT_CONFIG
    assert "recipe not found" in capsys.readouterr().err


def test_a_bad_set_is_a_config_error_naming_the_key_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bench amplify --set`` overrides the recipe as ``factory run --set`` does (e.g. to
    time a run with near-duplicate removal on); a bad value stops it before the devserver
    or Ray starts."""
    import factory.bench as bench

    def no_server(*args: object, **kw: object) -> None:
        raise AssertionError("the devserver was started")

    monkeypatch.setattr(bench, "_start_server", no_server)
    monkeypatch.setattr(bench.tempfile, "tempdir", str(tmp_path))
    argv = ["amplify", "--seeds", "2", "--target", "2", "--set", "near_duplicates={threshold: 7}"]
    assert main(argv) == EXIT_CONFIG
    assert "near_duplicates.threshold" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no work folder either
