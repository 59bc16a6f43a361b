"""Recipe fuzzing: any YAML at any key path is a config or a ConfigError naming its key path.

The shipped ``pipelines/airline.yaml`` is mutated (values replaced at random key
paths, keys deleted, unknown keys added) and overridden with random ``--set``
strings. ``load_recipe`` must either return a usable config or raise
``ConfigError`` whose ``key_path`` names a path of the input (or a missing key
under one); the CLI must exit 2 with one ``error: <key path>: ...`` line.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import io
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from factory.errors import ConfigError
from factory.recipe import SCHEMA_PATH, config_hash, load_recipe
from factory.run import main
from tests.conftest import ROOT

RECIPE = ROOT / "pipelines" / "airline.yaml"
BASE: dict[str, Any] = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
SPECIAL = {"<root>", "recipe", "--set"}
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _schema_keys(node: Any) -> set[str]:
    keys: set[str] = set()
    if isinstance(node, dict):
        keys |= set(node.get("properties") or {})
        for value in node.values():
            keys |= _schema_keys(value)
    elif isinstance(node, list):
        for value in node:
            keys |= _schema_keys(value)
    return keys


SCHEMA_KEYS = _schema_keys(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))


def key_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path of a YAML tree: mapping keys and list indexes, parents first."""
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += key_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out += key_paths(value, (*prefix, index))
    return out


PATHS = key_paths(BASE)
# Overrides that could make a dry run read the whole disk or the network are left out.
CLI_PATHS = [p for p in PATHS if p[:1] != ("seeds",)]


def dotted(path: tuple[Any, ...]) -> str:
    """A key path as ConfigError writes it: odd keys (empty, dotted, blank, control
    characters) as JSON strings, so the path stays one unambiguous line."""
    return ".".join(_step(p) for p in path)


def _step(part: Any) -> str:
    text = str(part)
    plain = text.isprintable() and not any(c.isspace() or c in '."' for c in text)
    return text if text and plain else json.dumps(text)


# --- strategies ------------------------------------------------------------------------------

NASTY = [
    10**4200,  # close to the 4300 digits Python converts from text by default
    float("nan"),
    float("inf"),
    -0.0,
    "",
    "x" * 600,
    "\x00\u2028\x85\u202e",
    datetime.date(2024, 1, 1),
    datetime.datetime(2024, 1, 1, 12, 0),
    b"\x00\xff",
    "2024-13-45",
    "~",
    "!!python/object:os.system",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.dates(),
    st.sampled_from(NASTY),
)
keys = st.one_of(st.text(max_size=12), st.integers(-3, 3), st.none(), st.booleans())
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=8,
)


def _flow(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10**6).strip()


RAW_OVERRIDES = [
    "amplify.seed=2024-13-45",
    "amplify.target=" + "9" * 5000,
    "llm.endpoints.\u00b2=x",
    "llm.endpoints.\u0663.base_url=x",
    "llm.sampling=" + "[" * 1500,
    "llm.sampling=" + "[" * 1500 + "]" * 1500,
    "llm.sampling=&a {x: *a}",
    "llm.sampling={1: 2, b: 3}",
    "llm.sampling={null: 1}",
    "prices={1: {input_per_mtok: 1, output_per_mtok: 1}}",
    "pipeline=" + "x" * 5000,
    "name=!!python/tuple [1]",
    "name=[unclosed",
    "name={a: 1}\n b: [",
    " . . =1",
    "=1",
    "..",
    "llm.model.x=1",
    "output=null",
    "-x",
    "a=b=c",
]
overrides = st.one_of(
    st.builds(lambda p, v: f"{dotted(p)}={_flow(v)}", st.sampled_from(PATHS), values),
    st.builds(lambda p, junk: f"{dotted(p)}={junk}", st.sampled_from(PATHS), st.text(max_size=30)),
    st.builds(lambda k, v: f"{k}={v}", st.text(max_size=15), st.text(max_size=15)),
    st.text(max_size=40),
    st.sampled_from(RAW_OVERRIDES),
)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """The shipped recipe with 1-3 values replaced, keys deleted or unknown keys added."""
    raw = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        paths = key_paths(raw)
        op = draw(st.sampled_from(["set", "delete", "add"]))
        if op == "add" or not paths:
            parents = [()] + [p for p in paths if isinstance(_at(raw, p), dict)]
            parent = draw(st.sampled_from(parents))
            _at(raw, parent)[draw(keys)] = draw(values)
            continue
        path = draw(st.sampled_from(paths))
        container = _at(raw, path[:-1])
        if op == "set":
            container[path[-1]] = draw(values)
        else:
            del container[path[-1]]
    return raw


def _at(raw: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        raw = raw[part]
    return raw


# --- the property ------------------------------------------------------------------------------


def input_paths(raw: Any, items: list[str]) -> set[str]:
    """Dotted paths of the recipe plus the key paths the overrides name (and their prefixes)."""
    paths = {dotted(p) for p in key_paths(raw)}
    for item in items:
        key, _, text = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        paths |= {dotted(tuple(parts[:i])) for i in range(1, len(parts) + 1)}
        try:  # an override's value brings its own keys
            value = yaml.safe_load(text)
            json.dumps(value, default=str, skipkeys=True)  # no cycles to walk
        except Exception:
            continue
        paths |= {dotted((*parts, *p)) for p in key_paths(value)}
    return paths


def names_input_path(message: str, raw: Any, items: list[str]) -> bool:
    """Whether ``message`` (``<key path>: ...``) starts with a path of the input, or a
    missing recipe key under one. Paths are compared as the CLI prints them (one line)."""
    # The recipe file is YAML: keys are compared as they read back from it (a NEL inside a
    # quoted key folds to a space, for one).
    known = input_paths(yaml.safe_load(yaml.safe_dump(raw, allow_unicode=True)), items)
    candidates = SPECIAL | known
    candidates |= {f"{p}.{leaf}" if p else leaf for p in {"", *known} for leaf in SCHEMA_KEYS}
    return any(message.startswith(f"{one_line(c)}: ") for c in candidates)


def one_line(text: str) -> str:
    return " ".join(text.splitlines())


def check_error(exc: ConfigError, raw: Any, items: list[str]) -> None:
    path = exc.key_path
    assert path, f"no key path: {exc}"
    assert str(exc).startswith(f"{path}: ")
    assert len(str(exc)) < 1000, "a message never echoes a whole value"
    assert names_input_path(one_line(str(exc)), raw, items), str(exc)[:300]


@contextlib.contextmanager
def recipe_file(raw: Any) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "recipe.yaml"
        text = yaml.safe_dump(raw, allow_unicode=True, sort_keys=False)
        path.write_text(text, encoding="utf-8")
        yield path


def load_or_error(raw: Any, items: list[str]) -> None:
    with recipe_file(raw) as path:
        try:
            cfg = load_recipe(path, items)
        except ConfigError as exc:
            check_error(exc, raw, items)
            return
    config_hash(cfg)  # a loaded config is usable: it dumps and hashes


@FUZZ
@given(mutated(), st.lists(overrides, max_size=2))
@example(copy.deepcopy(BASE), ["amplify.seed=2024-13-45"])
@example(copy.deepcopy(BASE), ["llm.endpoints.\u00b2=x"])
@example({**copy.deepcopy(BASE), None: 1, "zz": 2}, [])
@example(copy.deepcopy(BASE), ["llm.sampling={1: 2}"])
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_load_recipe_returns_a_config_or_names_the_key(
    raw: dict[str, Any], items: list[str]
) -> None:
    load_or_error(raw, items)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (b"name: \xff\xfe\n", "UTF-8"),
        (b"name: 2024-13-45\n", "YAML"),
        (b"name: " + b"[" * 1500 + b"]" * 1500 + b"\n", "YAML"),
        (b"amplify: {target: " + b"9" * 5000 + b"}\n", "YAML"),
        (b"a: [\n", "YAML"),
        (b"- 1\n", "mapping"),
        (b"\x00", "YAML"),
    ],
)
def test_unreadable_recipe_text_is_a_config_error(tmp_path: Path, text: bytes, words: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    assert info.value.key_path in SPECIAL and words in str(info.value)


@pytest.fixture(scope="module")
def offline() -> Iterator[None]:
    """A dry run never reaches a hub, whatever the overrides say."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


cli_overrides = st.one_of(
    st.builds(lambda p, v: f"{dotted(p)}={_flow(v)}", st.sampled_from(CLI_PATHS), values),
    st.builds(lambda k, v: f"{k}={v}", st.text(max_size=15), st.text(max_size=15)),
    st.text(max_size=30).filter(lambda s: not s.lstrip().startswith("seeds")),
    st.sampled_from(RAW_OVERRIDES),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(cli_overrides, min_size=1, max_size=2))
@example(["pipeline=" + "x" * 5000])
@example(["name=[unclosed"])
@example(["-x"])
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_cli_exits_2_with_one_line_naming_the_key(offline: None, items: list[str]) -> None:
    argv = [str(RECIPE), "--dry-run", "--json", "--set=seeds.limit=1"]
    argv += [f"--set={item}" for item in items]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    if code == 0:
        json.loads(out.getvalue())  # a valid recipe: the plan
        return
    text = err.getvalue()
    assert code == 2, text
    assert text.startswith("error: ") and text.endswith("\n") and text.count("\n") == 1, text
    assert "Traceback" not in text and len(text) < 1200
    message = text[len("error: ") : -1]
    assert names_input_path(message, BASE, ["seeds.limit=1", *items]), message[:300]


@pytest.mark.parametrize(
    ("key", "content"),
    [
        ("domain.tools", "binary"),
        ("domain.policy", "binary"),
        ("amplify.prompt", "binary"),
        ("domain.rules", "binary"),
        ("domain.tools", "folder"),
        ("domain.policy", "folder"),
        ("domain.rules", "folder"),
        ("domain.tools", "[1, 2]"),
        ("amplify.prompt", "{% block system %}x{% endblock %}"),
    ],
)
def test_cli_names_the_key_of_an_unusable_domain_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, content: str
) -> None:
    target = tmp_path / "file"
    if content == "folder":
        target.mkdir()
    elif content == "binary":
        target.write_bytes(b"\xa6\xff\x00\x9c" * 64)
    else:
        target.write_text(content, encoding="utf-8")
    code = main([str(RECIPE), "--dry-run", "--set", "seeds.limit=1", "--set", f"{key}={target}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {key}: ") and err.count("\n") == 1, err
