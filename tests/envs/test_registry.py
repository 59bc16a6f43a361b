"""Domains as plug-ins: entry point discovery, clear errors, data-only domains without Python.

The third-party domain here is a real installed distribution as far as
``importlib.metadata`` is concerned: a ``*.dist-info`` folder with an
``entry_points.txt`` on ``sys.path``, the way ``pip install`` leaves one.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from factory.envs import DomainPlugin, available_domains, get_environment, get_plugin
from factory.envs.pack import load_domain
from factory.envs.registry import ENTRY_POINT_GROUP, register_domain, reset_registry
from factory.errors import ConfigError
from factory.recipe import load_recipe
from factory.run import main
from tests.conftest import ROOT, install_distribution

# --- a third-party domain, installed on a temporary sys.path ---------------------------------

_PLUGIN_MODULE = '''
"""A counter shop: the smallest executable domain (one read tool, one write tool)."""
from pathlib import Path
from factory.envs.plugin import DataPack, DomainPlugin, Slicing

HERE = Path(__file__).parent


class ShopEnv:
    domain = "shop"

    def __init__(self, state):
        self._state = state

    @classmethod
    def create(cls, *, state=None, seed=None, n_items=3, validate_arguments=True, db_dir=None):
        items = {f"i{k}": seed or 0 for k in range(n_items)}
        return cls(state if state is not None else {"items": items})

    @property
    def state(self):
        return self._state

    @property
    def tool_names(self):
        return ("count", "add")

    def execute(self, name, arguments):
        item = arguments.get("item") if isinstance(arguments, dict) else None
        if item not in self._state["items"]:
            return f"Error: unknown item {item!r}"
        if name == "add":
            self._state["items"][item] += 1
        return str(self._state["items"][item])

    def copy(self):
        return ShopEnv({"items": dict(self._state["items"])})


def _slice(state, name, arguments):
    item = arguments.get("item") if isinstance(arguments, dict) else None
    return {"items": {k: v for k, v in state["items"].items() if k == item}}


def _project(state, like):
    return {"items": {k: state["items"][k] for k in like["items"] if k in state["items"]}}


def count(data, item):
    return str(data["items"][item])


def plugin():
    return DomainPlugin(
        name="shop",
        pack=DataPack(tools=HERE / "shop_tools.json"),
        environment=ShopEnv.create,
        world_sizes=frozenset({"n_items"}),
        slicing=Slicing(_slice, _project, lambda state, like: ShopEnv(state).copy()),
        tool_functions=lambda: {"count": count},
    )


not_a_plugin = 42
misnamed = DomainPlugin(name="other")
'''

SHOP_TOOLS = [
    {
        "name": "count",
        "description": "How many of an item are in stock.",
        "parameters": {
            "type": "object",
            "properties": {"item": {"type": "string"}},
            "required": ["item"],
        },
        "x-kind": "read",
    },
    {
        "name": "add",
        "description": "Add one item to the stock.",
        "parameters": {
            "type": "object",
            "properties": {"item": {"type": "string"}},
            "required": ["item"],
        },
        "x-kind": "write",
    },
]


def _install(site: Path, module: str, entry_points: dict[str, str]) -> None:
    """Lay out an installed distribution: the module and its ``dist-info`` metadata."""
    (site / f"{module}.py").write_text(_PLUGIN_MODULE, encoding="utf-8")
    (site / "shop_tools.json").write_text(json.dumps(SHOP_TOOLS), encoding="utf-8")
    install_distribution(site, module, ENTRY_POINT_GROUP, entry_points)


@pytest.fixture()
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh site directory on ``sys.path``; the registry forgets it afterwards."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    reset_registry()
    yield root
    for name in [m for m in sys.modules if m.startswith("shop_plugin")]:
        del sys.modules[name]
    reset_registry()


def test_the_builtin_airline_registers_through_the_entry_point_group() -> None:
    from importlib.metadata import entry_points

    (point,) = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == "airline"]
    assert point.value == "factory.envs.airline.plugin:plugin"
    plugin = get_plugin("airline")
    assert all(plugin.has(part) for part in ("pack", "environment", "slicing", "sampler"))
    assert plugin.fidelity_renames == {"province": "state"}


def test_a_third_party_domain_is_found_through_its_entry_point(site: Path) -> None:
    _install(site, "shop_plugin", {"shop": "shop_plugin:plugin"})
    names = available_domains()
    assert "shop" in names and "airline" in names and names == sorted(names)
    # Listing the names imports nothing: registration is no import side effect.
    assert "shop_plugin" not in sys.modules
    assert "shop" in available_domains("slicing")
    # A part is listed for exactly the domains that supply it (shop has no sampler).
    for part in ("slicing", "sampler", "grounding"):
        assert available_domains(part) == [d for d in names if get_plugin(d).has(part)]
    assert "shop" not in available_domains("sampler")
    env = get_environment("shop", seed=2)
    assert env.execute("add", {"item": "i1"}) == "3"
    assert get_plugin("shop").pack is not None


def test_the_engine_drives_a_third_party_domain(site: Path, tmp_path: Path) -> None:
    from factory.envsim.steps import check_step, decompose_calls, tool_source

    _install(site, "shop_plugin", {"shop": "shop_plugin:plugin"})
    env = get_environment("shop", seed=1)
    (read, write) = decompose_calls(
        [("count", {"item": "i0"}), ("add", {"item": "i2"})], env, env_id="shop-1"
    )
    assert read.observation == "1" and read.delta == []
    assert write.state_after == {"items": {"i2": 2}} and len(write.delta) == 1
    for sample in (read, write):
        check_step(sample, domain="shop")
    assert tool_source("shop", "count") is not None and tool_source("shop", "add") is None
    # A recipe that names only the domain gets the plug-in's pack.
    recipe = tmp_path / "shop.yaml"
    recipe.write_text(
        "name: shop\npipeline: curate\ndomain: {name: shop}\nseeds: {path: x.jsonl}\n"
        "output: {dataset_name: shop}\n",
        encoding="utf-8",
    )
    domain = load_domain(load_recipe(recipe).domain)
    assert [t["name"] for t in domain.tools] == ["count", "add"]
    assert domain.write_tools() == {"add"}


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("shop_plugin:not_a_plugin", "gives int, not a DomainPlugin"),
        ("shop_plugin:misnamed", "names its plug-in 'other'"),
        ("shop_plugin:nowhere", "cannot load entry point"),
        ("no_such_module:plugin", "cannot load entry point"),
    ],
)
def test_a_broken_plugin_is_a_config_error_naming_it(site: Path, target: str, message: str) -> None:
    _install(site, "shop_plugin", {"shop": target})
    with pytest.raises(ConfigError, match=message) as info:
        get_plugin("shop")
    assert info.value.key_path == "domain"
    assert get_plugin("airline").name == "airline"  # one broken plug-in does not hide the rest
    assert "shop" not in available_domains("environment")
    assert "airline" in available_domains("environment")


def test_unknown_domains_and_missing_parts_name_the_known_ones() -> None:
    known = ", ".join(available_domains())
    with pytest.raises(ConfigError, match=rf"unknown domain 'hotel'; known domains: {known} \("):
        get_plugin("hotel")
    register_domain(DomainPlugin("bare"))
    try:
        grounded = ", ".join(d for d in available_domains("grounding") if d != "bare")
        with pytest.raises(
            ConfigError, match=f"'bare' supplies no grounding; domains that do: {grounded}$"
        ):
            get_plugin("bare", needs="grounding")
        with pytest.raises(ConfigError, match="already registered"):
            register_domain(DomainPlugin("bare"))
    finally:
        reset_registry()
    assert "bare" not in available_domains()


# --- a data-only domain: files, no Python --------------------------------------------------------


def _archive(tmp: Path, pipeline: str, extra: str = "") -> Path:
    """A domain pack and recipe for a domain no plug-in knows."""
    tools = [
        {
            "name": "find_book",
            "description": "Find a book by title.",
            "parameters": {
                "type": "object",
                "properties": {"title": {"type": "string"}},
                "required": ["title"],
            },
            "x-kind": "read",
        },
        {
            "name": "lend_book",
            "description": "Lend a book to a member.",
            "parameters": {
                "type": "object",
                "properties": {"book_id": {"type": "string"}, "member_id": {"type": "string"}},
                "required": ["book_id", "member_id"],
            },
            "x-kind": "write",
        },
    ]
    (tmp / "tools.json").write_text(json.dumps(tools), encoding="utf-8")
    (tmp / "policy.md").write_text("# Library policy\n\nLend at most 3 books.\n", encoding="utf-8")
    (tmp / "archive.yaml").write_text(
        "domain: archive\nrules:\n  - id: book_id_format\n    description: B + 4 digits.\n"
        "    tools: [lend_book]\n    argument: book_id\n"
        '    schema: {type: string, pattern: "^B[0-9]{4}$"}\n',
        encoding="utf-8",
    )

    def seed(book_id: str, title: str) -> dict[str, Any]:
        call = {"name": "lend_book", "arguments": {"book_id": book_id, "member_id": "m7"}}
        found = {"name": "find_book", "arguments": {"title": title}}
        return {
            "system": "You are an archive assistant.",
            "tools": json.dumps([{k: v for k, v in t.items() if k != "x-kind"} for t in tools]),
            "conversations": [
                {"from": "human", "value": f"I am member m7. Can I borrow {title}?"},
                {"from": "function_call", "value": json.dumps(found)},
                {"from": "observation", "value": json.dumps({"book_id": book_id})},
                {"from": "gpt", "value": f"{title} is {book_id}. Shall I lend it to you?"},
                {"from": "human", "value": "Yes, please."},
                {"from": "function_call", "value": json.dumps(call)},
                {"from": "observation", "value": json.dumps({"status": "lent"})},
                {"from": "gpt", "value": f"Done: {title} is lent to you."},
            ],
        }

    seeds = [seed("B0001", "Dune"), seed("B0002", "Emma"), seed("bad-id", "Ulysses")]
    (tmp / "seeds.jsonl").write_text("".join(json.dumps(s) + "\n" for s in seeds))
    recipe = tmp / f"archive-{pipeline}.yaml"
    amplify = (
        f"llm: {{model: m, endpoints: [{{base_url: 'http://127.0.0.1:9/v1'}}]}}\n"
        f"amplify: {{target: 10, prompt: {ROOT / 'prompts/amplify.j2'}{extra}}}\n"
        f"prefilter: {{prompt: {ROOT / 'prompts/prefilter.j2'}}}\n"
        "prices: {m: {input_per_mtok: 1, output_per_mtok: 1}}\n"
        if pipeline == "amplify"
        else ""
    )
    recipe.write_text(
        f"name: archive\npipeline: {pipeline}\n"
        "domain: {name: archive, tools: tools.json, policy: policy.md, rules: archive.yaml}\n"
        "seeds: {path: seeds.jsonl}\noutput: {dataset_name: archive}\n" + amplify,
        encoding="utf-8",
    )
    return recipe


def test_a_data_only_domain_runs_the_seed_checks_with_no_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="unknown domain 'archive'"):
        get_plugin("archive")  # no plug-in, no code: only files
    assert main([str(_archive(tmp_path, "curate")), "--dry-run", "--json"]) == 0
    seeds = json.loads(capsys.readouterr().out)["seeds"]
    # The pack's own rule (book ids) rejects the third seed.
    assert seeds == {"read": 3, "valid": 2, "rejected": 1, "reasons": {"domain:book_id_format": 1}}
    assert main([str(_archive(tmp_path, "amplify")), "--dry-run", "--show-prompts"]) == 0
    out = capsys.readouterr().out
    assert "seeds: 3 read, 2 valid" in out and "lend_book" in out


def test_a_data_only_domain_asking_for_grounding_names_the_domains_that_have_it(
    tmp_path: Path,
) -> None:
    from factory.engine.jobs.amplify import preflight

    cfg = load_recipe(
        _archive(
            tmp_path,
            "amplify",
            extra=f", grounding: {{mode: verify, prompt: {ROOT / 'prompts/amplify_grounded.j2'}}}",
        )
    )
    known = ", ".join(available_domains())
    with pytest.raises(ConfigError, match=f"unknown domain 'archive'; known domains: {known}"):
        # what a real run checks before it starts Ray or calls a model
        preflight(cfg, load_domain(cfg.domain))


def test_an_envsim_recipe_for_a_domain_without_a_sampler_fails_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = str(ROOT / "pipelines" / "airline-envsim.yaml")
    code = main([recipe, "-o", str(tmp_path / "out"), "--set", "domain.name=archive"])
    assert code == 2
    known = ", ".join(available_domains())
    assert f"unknown domain 'archive'; known domains: {known}" in capsys.readouterr().err
    assert not (tmp_path / "out" / "candidates").exists()
