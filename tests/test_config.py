from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from factory.errors import ConfigError
from factory.recipe import (
    SCHEMA_PATH,
    apply_overrides,
    config_hash,
    json_schema,
    load_recipe,
    resolve_recipe_path,
)
from tests.conftest import ROOT

BASE = {
    "name": "t",
    "pipeline": "curate",
    "domain": {"name": "airline", "tools": "tools.json"},
    "seeds": {"path": "seeds.jsonl"},
    "output": {"dataset_name": "d"},
}


def write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_shipped_schema_is_current() -> None:
    shipped = json.loads(SCHEMA_PATH.read_text())
    assert shipped == json_schema(), "run: python -m factory.schemas"


@pytest.mark.parametrize(
    "recipe", sorted((ROOT / "pipelines").glob("*.yaml")), ids=lambda p: p.name
)
def test_shipped_recipes_load(recipe: Path) -> None:
    cfg = load_recipe(recipe)
    domains = [p.domain for p in cfg.parts] if cfg.parts else [cfg.domain]  # a mixed recipe
    # a tool-calling domain names its tools, a text-action one its grammar
    assert all(cfg.resolve(d.tools or d.grammar or "-").is_file() for d in domains)


def test_relative_paths_resolve_against_recipe_folder(tmp_path: Path) -> None:
    cfg = load_recipe(write(tmp_path, BASE))
    assert cfg.resolve("seeds.jsonl") == tmp_path / "seeds.jsonl"


@pytest.mark.parametrize(
    ("mutate", "key_path", "words"),
    [
        (lambda d: d.update(bogus=1), "bogus", "unknown key"),
        (lambda d: d["seeds"].update(limt=3), "seeds.limt", "unknown key"),
        (lambda d: d["seeds"].update(limit="many"), "seeds.limit", "expected"),
        (lambda d: d["output"].pop("dataset_name"), "output.dataset_name", "missing"),
        (lambda d: d.pop("domain"), "domain", "missing"),
        (lambda d: d.update(pipeline="bake"), "pipeline", "one of"),
        (lambda d: d["output"].update(reasoning="maybe"), "output.reasoning", "one of"),
        (lambda d: d.update(llm={"model": 3}), "llm.model", "expected"),
        (lambda d: d.update(llm={"model": "m", "concurrency": 0}), "llm.concurrency", "minimum"),
    ],
)
def test_bad_recipe_names_key_path(tmp_path: Path, mutate, key_path: str, words: str) -> None:
    data = json.loads(json.dumps(BASE))
    mutate(data)
    with pytest.raises(ConfigError) as info:
        load_recipe(write(tmp_path, data))
    assert info.value.key_path == key_path
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("recipe", "overrides", "key_path"),
    [
        ("os.yaml", ["domain.tools=../prompts/airline/tools.json"], "domain.tools"),
        ("airline.yaml", ["domain.compose=../prompts/office/compose.yaml"], "domain.compose"),
        ("os.yaml", ["amplify.grounding={mode: verify}"], "amplify.grounding"),
        ("os.yaml", ["amplify.system_prompt_format=hermes"], "amplify.system_prompt_format"),
        ("mixed.yaml", ["parts.0.domain.compose=x.yaml"], "parts.0.domain.compose"),
    ],
)
def test_text_action_domains_refuse_what_needs_tools(
    recipe: str, overrides: list[str], key_path: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(ROOT / "pipelines" / recipe, overrides)
    assert info.value.key_path == key_path


def test_amplify_needs_llm_section(tmp_path: Path) -> None:
    data = dict(BASE, pipeline="amplify", amplify={"target": 10})
    with pytest.raises(ConfigError) as info:
        load_recipe(write(tmp_path, data))
    assert info.value.key_path == "llm"


def test_overrides_parse_yaml_values_and_reach_lists() -> None:
    raw = {"a": {"b": 1}, "l": [{"x": 1}]}
    apply_overrides(raw, ["a.b=2", "a.c=[1, 2]", "l.0.x=true", "n.m=hello"])
    assert raw == {"a": {"b": 2, "c": [1, 2]}, "l": [{"x": True}], "n": {"m": "hello"}}


@pytest.mark.parametrize("item", ["nokey", "=3", "l.5.x=1", "a.b.c=1"])
def test_bad_overrides(item: str) -> None:
    with pytest.raises(ConfigError):
        apply_overrides({"a": {"b": 1}, "l": []}, [item])


def test_a_bare_date_says_to_quote_it(tmp_path: Path) -> None:
    """YAML reads ``2026-10-21`` (an Anthropic API version) as a date, which no request
    body or config hash can hold: the error names the key and says to quote it."""
    with pytest.raises(ConfigError) as info:
        load_recipe(write(tmp_path, BASE), ["llm.backend_options.api_version=2026-10-21"])
    assert info.value.key_path == "llm.backend_options.api_version"
    assert '"2026-10-21"' in str(info.value) and "date" in str(info.value)


def test_override_of_unknown_key_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(write(tmp_path, BASE), ["output.shards=3"])
    assert info.value.key_path == "output.shards"


def test_config_hash_ignores_output_dir(tmp_path: Path) -> None:
    p = write(tmp_path, BASE)
    a = config_hash(load_recipe(p, ["output.dir=x"]))
    b = config_hash(load_recipe(p, ["output.dir=y"]))
    c = config_hash(load_recipe(p, ["output.shard_rows=7"]))
    assert a == b != c


def test_bare_recipe_name_resolves_to_pipelines(tmp_path: Path) -> None:
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "airline.yaml").write_text("x: 1")
    assert resolve_recipe_path("airline.yaml", tmp_path) == tmp_path / "pipelines" / "airline.yaml"
    assert resolve_recipe_path("airline", tmp_path) == tmp_path / "pipelines" / "airline.yaml"
    with pytest.raises(ConfigError):
        resolve_recipe_path("nope.yaml", tmp_path)


def test_a_shipped_recipe_is_found_from_any_folder(tmp_path: Path) -> None:
    from factory import packs

    shipped = packs.folder("pipelines") / "airline-envsim.yaml"
    assert resolve_recipe_path("airline-envsim.yaml", tmp_path) == shipped.resolve()
    assert resolve_recipe_path("airline-envsim", tmp_path) == shipped.resolve()
    assert resolve_recipe_path("factory:pipelines/airline-envsim.yaml", tmp_path) == shipped
    # A recipe of the same name in the working folder's pipelines/ wins.
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "airline-envsim.yaml").write_text("x: 1")
    mine = tmp_path / "pipelines" / "airline-envsim.yaml"
    assert resolve_recipe_path("airline-envsim.yaml", tmp_path) == mine
    with pytest.raises(ConfigError, match="recipe not found"):
        resolve_recipe_path("factory:pipelines/nope.yaml", tmp_path)


def test_a_missing_recipe_names_each_place_once_and_the_nearest_recipe(tmp_path: Path) -> None:
    # From the repository root, its pipelines/ is also the shipped folder (issue 39: each
    # place was listed twice, and airlin.yaml.yaml tried).
    with pytest.raises(ConfigError) as info:
        resolve_recipe_path("airlin.yaml", ROOT)
    message = str(info.value)
    tried = message.split("(tried ", 1)[1].split(")", 1)[0].split(", ")
    assert tried == [str(ROOT / "airlin.yaml"), str(ROOT / "pipelines" / "airlin.yaml")]
    assert message.endswith("; did you mean airline.yaml?")
    with pytest.raises(ConfigError, match=r"did you mean airline-envsim\.yaml\?"):
        resolve_recipe_path("airline-envsm", tmp_path)
    # Nothing close: the recipes there are listed instead of a wild guess.
    with pytest.raises(ConfigError) as info:
        resolve_recipe_path("zzz.yaml", tmp_path)
    assert "did you mean" not in str(info.value)
    assert "recipes there: airline.yaml, " in str(info.value)


def test_recipe_paths_resolve_against_the_recipe_or_the_shipped_files(tmp_path: Path) -> None:
    from factory import packs

    cfg = load_recipe(write(tmp_path, BASE))
    assert cfg.resolve("tools.json") == tmp_path / "tools.json"
    assert cfg.resolve("factory:prompts/amplify.j2") == packs.folder("prompts") / "amplify.j2"
    assert cfg.resolve("factory:prompts/amplify.j2").is_file()
    with pytest.raises(ConfigError, match="leaves the shipped prompts/ folder"):
        cfg.resolve("factory:prompts/../setup.py")
    with pytest.raises(ConfigError, match="shipped folders: pipelines, prompts, filters, seeds"):
        cfg.resolve("factory:docs/x.md")


def test_a_path_no_system_can_open_names_its_key(tmp_path: Path) -> None:
    """Paths are resolved at load (issue 34): one the system refuses (a NUL byte, found by
    the fuzz test) is a recipe error naming its key, not a crash."""
    data = yaml.safe_load((ROOT / "pipelines" / "airline.yaml").read_text())
    data["domain"]["tools"] = "tools\x00.json"
    with pytest.raises(ConfigError) as info:
        load_recipe(write(tmp_path, data))
    assert info.value.key_path == "domain.tools" and "not a usable path" in str(info.value)
