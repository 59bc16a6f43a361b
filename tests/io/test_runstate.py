"""A run whose prompts changed since the folder's last run says what that costs first."""

from __future__ import annotations

import json
from pathlib import Path

from factory.config import load_recipe
from factory.io.cache import ResponseCache
from factory.io.runstate import PROMPTS_FILE, note_prompt_changes
from tests.conftest import ROOT


def test_changed_prompts_name_the_stage_and_its_unusable_cached_answers(tmp_path: Path) -> None:
    cfg = load_recipe(ROOT / "pipelines" / "airline.yaml")
    out = tmp_path / "out"
    with ResponseCache(str(out / "cache")) as cache:
        for i in range(3):
            cache.put(f"amplify-{i:032x}", {"text": "a"})
        cache.put("prefilter-" + "0" * 32, {"text": "p"})
    first = {"prefilter": "p1", "amplify": "a1"}
    assert note_prompt_changes(cfg, out, first) == []  # the folder's first run: nothing to say
    assert json.loads((out / PROMPTS_FILE).read_text()) == first
    assert note_prompt_changes(cfg, out, first) == []  # same prompts: the cache applies
    (line,) = note_prompt_changes(cfg, out, {"prefilter": "p1", "amplify": "a2"})
    assert line.startswith("the amplify prompts changed since this folder's last run")
    assert "its 3 cached amplify answers no longer apply" in line
    assert json.loads((out / PROMPTS_FILE).read_text())["amplify"] == "a2"


def test_the_fingerprint_of_a_stage_follows_its_policy(tmp_path: Path) -> None:
    from factory.engine.prompts import prompt_fingerprints

    policy = tmp_path / "policy.md"
    policy.write_text("# Policy\n\nBe kind.\n")
    recipe = ROOT / "pipelines" / "airline.yaml"
    before = prompt_fingerprints(load_recipe(recipe, [f"domain.policy={policy}"]))
    assert set(before) == {"prefilter", "amplify"}
    policy.write_text("# Policy\n\nBe kind, and brief.\n")
    after = prompt_fingerprints(load_recipe(recipe, [f"domain.policy={policy}"]))
    assert before["amplify"] != after["amplify"] and before["prefilter"] != after["prefilter"]
    other_model = prompt_fingerprints(
        load_recipe(recipe, [f"domain.policy={policy}", "llm.model=x"])
    )
    assert other_model["amplify"] != after["amplify"]
    assert prompt_fingerprints(load_recipe(ROOT / "pipelines" / "airline-envsim.yaml")) == {}
