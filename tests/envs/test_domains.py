"""What every registered domain keeps, whoever wrote it: one case per domain of the registry
(the shipped ones and any installed, e.g. ``tests/domains/library``), so a new domain adds
cases here instead of copying a domain's tests.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest

from factory.envs.pack import domain_from_pack
from factory.envs.plugin import Slicing
from factory.envs.registry import (
    available_domains,
    generate_environment,
    get_plugin,
    register_domain,
    reset_registry,
)
from factory.envs.table_domain import RecordedSlicing, SubjectScenarios
from factory.envs.tables import TableWorld
from factory.envsim.grounding import GroundingWorld
from factory.envsim.sampler import EpisodeSampler
from factory.envsim.steps import decompose

GENERATED = [d for d in available_domains("environment") if get_plugin(d).world_sizes]
SAMPLED = [d for d in available_domains("sampler") if get_plugin(d).has("slicing")]
TABLES = [d for d in GENERATED if isinstance(generate_environment(d, 0), TableWorld)]


@pytest.mark.parametrize("domain", GENERATED)
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_a_generated_world_is_the_same_for_a_seed_and_forks_independently(domain: str) -> None:
    env = generate_environment(domain, 4)
    assert json.dumps(env.state, sort_keys=True) == json.dumps(
        generate_environment(domain, 4).state, sort_keys=True
    )
    before = json.dumps(env.state, sort_keys=True)
    sampler = EpisodeSampler(domain, 4) if domain in SAMPLED else None
    if sampler is not None:  # run writes on forks: the world they came from does not change
        for traj in sampler.episodes(5, seed=1):
            assert traj.calls()
        assert json.dumps(sampler.world.state, sort_keys=True) == json.dumps(
            generate_environment(domain, 4).state, sort_keys=True
        )
    assert json.dumps(env.state, sort_keys=True) == before


@pytest.mark.parametrize("domain", [d for d in GENERATED if get_plugin(d).pack is not None])
def test_the_pack_describes_the_worlds_tools(domain: str) -> None:
    plugin = get_plugin(domain)
    assert plugin.pack is not None
    pack = domain_from_pack(domain, plugin.pack)
    env = generate_environment(domain, 0)
    assert {t["name"] for t in pack.tools} == set(env.tool_names)
    if isinstance(env, TableWorld):
        assert pack.write_tools() == set(env.write_tools)


@pytest.mark.parametrize("domain", SAMPLED)
def test_every_sampled_step_keeps_the_slicing_guarantee(domain: str) -> None:
    sampler = EpisodeSampler(domain, 0)
    steps = [
        step
        for traj in sampler.episodes(15, seed=2)
        for step in decompose(traj, sampler.fresh_env(), env_id=sampler.env_id, check=True)
    ]
    assert len(steps) > 15  # check=True raises on the first step that breaks it


@pytest.fixture()
def recorded(request: pytest.FixtureRequest) -> Iterator[str]:
    """The domain re-registered with the default slicing of a table world."""
    domain = request.param
    plugin = get_plugin(domain)
    world = type(generate_environment(domain, 0))
    assert issubclass(world, TableWorld) and plugin.slicing is not None
    rules = RecordedSlicing(world)
    slicing = Slicing(
        slice_for=rules.slice_for,
        project=lambda state, like: rules.project(state, like=like),
        world=plugin.slicing.world,
    )
    register_domain(dataclasses.replace(plugin, slicing=slicing), replace=True)
    yield domain
    reset_registry()


@pytest.mark.parametrize("recorded", TABLES, indirect=True)
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_the_default_slicing_is_exact_on_every_table_world(recorded: str) -> None:
    """The records a call touches are enough to run it again: sampled episodes of every
    table-world domain, decomposed and checked with the default slicing instead of theirs."""
    sampler = EpisodeSampler(recorded, 0)
    count = 0
    for traj in sampler.episodes(12, seed=5):
        for step in decompose(traj, sampler.fresh_env(), env_id=sampler.env_id, check=True):
            count += 1
            assert all(isinstance(records, dict) for records in step.state_before.values())
    assert count > 12


@pytest.mark.parametrize("domain", available_domains("grounding"))
def test_grounding_scenarios_are_slices_of_their_world(domain: str) -> None:
    world = GroundingWorld(domain, 1)
    for index in range(6):
        scenario = world.scenario(index, 3)
        assert scenario == world.scenario(index, 3)
        assert world.subject(scenario) is not None
        world.fresh_env(scenario)  # raises unless the scenario matches its world


@pytest.mark.parametrize("domain", TABLES)
def test_the_default_grounding_shows_a_subject_and_what_mentions_it(domain: str) -> None:
    env = generate_environment(domain, 2)
    scenarios = SubjectScenarios(env)
    first = next(iter(env.state))
    for index in range(5):
        scenario = scenarios.scenario(index, 0)
        (subject,) = scenario[first]
        assert scenarios.subject(scenario) == subject
        assert scenarios.mismatch(scenario) is None
        assert set(scenario) == set(env.state)
