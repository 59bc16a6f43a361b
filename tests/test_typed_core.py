"""The recipe is typed and resolved once (issue 34): job kinds are types, and no code
outside the recipe package resolves a recipe path or asks which kind it holds.

The counts are of the code as written (a grep, like a newcomer reading it): outside
``factory/recipe/`` (and the job registry, the one place that maps a kind to its job)
no ``pipeline ==``/``!=``, no ``parts is (not) None``, no ``assert cfg.<section> is not
None`` and no ``cfg.resolve(``; the loader's own output is checked beside them.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from factory.recipe import (
    AmplifyRecipe,
    CurateRecipe,
    EnvsimRecipe,
    MixRecipe,
    RecipeBase,
    config_hash,
    load_recipe,
)
from tests.conftest import ROOT

ALLOWED = ("factory/recipe/", "factory/engine/jobs/registry.py")

#: What the typed recipe replaces, each a pattern over one line of code.
FORBIDDEN = {
    "a pipeline compared to a string": r"\bpipeline\s*[!=]=",
    "parts tested for None": r"\bparts\s+is\s+(not\s+)?None",
    "a recipe section asserted present": (
        r"assert\s+(self\.)?(cfg|recipe|sub)\.\w+\s+is\s+not\s+None"
    ),
    "a recipe path resolved outside the recipe": r"\b(cfg|recipe|sub|self\.cfg)\.resolve\(",
}


def _code_lines() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted((ROOT / "factory").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(ALLOWED):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            out.append((rel, n, line))
    return out


@pytest.mark.parametrize("what", sorted(FORBIDDEN))
def test_no_kind_string_no_optional_section_no_resolve_outside_the_recipe(what: str) -> None:
    pattern = re.compile(FORBIDDEN[what])
    found = [f"{rel}:{n}: {line.strip()}" for rel, n, line in _code_lines() if pattern.search(line)]
    assert found == [], f"{what}: {found}"


def test_the_patterns_find_what_they_forbid() -> None:
    """The grep is not vacuous: each pattern matches the code it replaced."""
    old = {
        "a pipeline compared to a string": 'if cfg.pipeline == "amplify":',
        "parts tested for None": "if cfg.parts is not None:",
        "a recipe section asserted present": "assert cfg.amplify is not None",
        "a recipe path resolved outside the recipe": "Mixture.load(cfg.resolve(mx.path))",
    }
    for what, line in old.items():
        assert re.search(FORBIDDEN[what], line), what


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("airline.yaml", AmplifyRecipe),
        ("airline-seeds.yaml", CurateRecipe),
        ("airline-envsim.yaml", EnvsimRecipe),
        ("mixed.yaml", MixRecipe),
        ("office-compose.yaml", AmplifyRecipe),
    ],
)
def test_a_recipe_loads_as_its_kind_with_every_path_absolute(name: str, kind: type) -> None:
    cfg = load_recipe(ROOT / "pipelines" / name)
    assert type(cfg) is kind
    paths: list[str] = []
    for domain in cfg.domains():
        paths += [p for p in (domain.tools, domain.policy, domain.rules, domain.grammar) if p]
    for seeds in cfg.seed_sections():
        paths += seeds.path if isinstance(seeds.path, list) else [seeds.path or "/"]
    paths.append(cfg.prefilter.prompt)
    if cfg.amplify is not None:
        paths.append(cfg.amplify.prompt)
    if cfg.mixture is not None:
        paths.append(cfg.mixture.path)
    assert paths and all(Path(p).is_absolute() for p in paths), paths
    assert all(Path(p).exists() for p in paths if "*" not in p), paths


def test_the_kinds_require_their_sections_and_say_so(tmp_path: Path) -> None:
    """An amplify recipe without ``llm`` is refused naming the key, as before the types."""
    from factory.errors import ConfigError

    text = (ROOT / "pipelines" / "airline.yaml").read_text(encoding="utf-8")
    start = text.index("\nllm:")
    end = text.index("\nprefilter:")
    broken = tmp_path / "broken.yaml"
    broken.write_text(text[:start] + text[end:].replace("../", f"{ROOT}/"), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_recipe(broken)
    assert err.value.key_path == "llm" and "amplify pipeline needs an llm section" in str(err.value)
    assert AmplifyRecipe.model_fields["llm"].is_required()
    assert MixRecipe.model_fields["parts"].is_required()
    assert EnvsimRecipe.model_fields["mixture"].is_required()
    assert not RecipeBase.model_fields["llm"].is_required()


def test_the_hash_and_run_state_read_the_recipe_as_written(tmp_path: Path) -> None:
    """Resolving paths does not change the config hash: the same file hashes the same
    from another folder (a moved checkout resumes its output folders)."""
    here = load_recipe(ROOT / "pipelines" / "airline.yaml")
    moved = tmp_path / "pipelines"
    moved.mkdir()
    (moved / "airline.yaml").write_text(
        (ROOT / "pipelines" / "airline.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    there = load_recipe(moved / "airline.yaml")
    assert here.domain.tools != there.domain.tools  # resolved against each folder
    assert config_hash(here) == config_hash(there)
    assert here.as_written()["domain"]["tools"] == "../prompts/airline/tools.json"
    assert here.as_written() == there.as_written()


def test_a_mixed_recipes_part_is_an_amplify_recipe_with_its_own_paths() -> None:
    cfg = load_recipe(ROOT / "pipelines" / "mixed.yaml")
    assert isinstance(cfg, MixRecipe)
    part = cfg.part(1)
    assert type(part) is AmplifyRecipe and part.parts is None
    assert part.domain == cfg.parts[1].domain and part.seeds == cfg.parts[1].seeds
    written = part.as_written()
    assert written["seeds"] == cfg.as_written()["parts"][1]["seeds"]


def test_the_amplify_stage_specs_carry_settings_and_the_domain_not_the_recipe(
    tmp_path: Path,
) -> None:
    """What the amplify job sends its workers: no recipe in any spec, and each spec
    small beside the seeds it carries (the recipe was ~2.6 kB per spec on main a771dbb)."""
    from factory.engine.jobs.amplify import AmplifyJob
    from factory.engine.result import new_manifest

    overrides = [
        "llm.endpoints.0.base_url=http://127.0.0.1:9/v1",
        "llm.endpoints.0.api_key_env=null",
    ]
    cfg = load_recipe(ROOT / "pipelines" / "airline.yaml", overrides)
    chains: dict[str, list] = {}
    job = AmplifyJob(cfg, tmp_path, new_manifest(cfg), lambda n, s: chains.__setitem__(n, list(s)))
    chains.update(job.chains)
    job.amplify_planner._start_calls({"s1": "{}"})
    specs = [spec for chain in chains.values() for spec in chain]
    assert [fn.__name__ for fn, _ in specs] == [
        "build_seed_check",
        "build_prefilter",
        "build_amplify",
        "build_postprocess",
    ]
    for fn, args in specs:
        assert not any(isinstance(a, RecipeBase) for a in args), fn.__name__
        pickle.dumps((fn, args))  # what Ray sends: it must pickle
