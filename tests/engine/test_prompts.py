"""Prompt rendering for text-action domains: the grammar in the cacheable static block."""

from __future__ import annotations

import json

from factory.core.formats import parse_record
from factory.core.grammar import ActionGrammar
from factory.core.trajectory import Trajectory
from factory.engine.prompts import DIRECTIONS, PromptTemplate
from factory.envs.pack import load_domain
from factory.recipe import load_recipe
from tests.conftest import ROOT


def _seeds(name: str, grammar: ActionGrammar) -> list[Trajectory]:
    lines = (ROOT / "seeds" / name / "seeds.jsonl").read_text().splitlines()[:3]
    return [
        parse_record(json.loads(x), source=f"{name}:{n}", grammar=grammar)
        for n, x in enumerate(lines)
    ]


def test_the_grammar_and_policy_are_the_static_prefix_of_every_call() -> None:
    cfg = load_recipe(ROOT / "pipelines" / "os.yaml")
    assert cfg.amplify is not None
    domain = load_domain(cfg.domain)
    assert domain.grammar is not None
    template = PromptTemplate(cfg.resolve(cfg.amplify.prompt), domain)
    prompts = [
        template.render(seed, variation=v) for v, seed in enumerate(_seeds("os", domain.grammar))
    ]
    systems = {p.messages[0]["content"] for p in prompts}
    assert len(systems) == 1  # byte-identical: provider and vLLM prefix caches reuse it
    static = systems.pop()
    assert domain.grammar.to_json() in static and domain.policy.strip() in static
    assert all(p.static_tokens() > p.input_tokens() / 2 for p in prompts)
    # The pack's own variation directions, not the customer-service ones.
    first = prompts[0].messages[1]["content"]
    assert domain.grammar.directions[0] in first and DIRECTIONS[0] not in first
    # The reference is shown as the agent wrote it: no tool_calls, observations as tools.
    shown = template.reference_json(_seeds("os", domain.grammar)[0])
    assert '"tool_calls"' not in shown and '"role": "tool"' in shown and "Act: bash" in shown


def test_a_composition_prompt_shows_the_rules_and_the_companions() -> None:
    cfg = load_recipe(ROOT / "pipelines" / "office-compose.yaml")
    assert cfg.amplify is not None
    domain = load_domain(cfg.domain)
    assert domain.compose is not None and domain.grammar is not None
    template = PromptTemplate(cfg.resolve(cfg.amplify.prompt), domain)
    assert domain.compose.to_json() in template.static
    seed = parse_record(
        json.loads((ROOT / "seeds/office/email.jsonl").read_text().splitlines()[0]),
        source="e:0",
        grammar=domain.grammar,
    )
    user = template.render(seed, companions_json="[]").messages[1]["content"]
    assert "### Reference trajectory" in user and "### Companion references" in user
