"""One strict YAML loader: hostile text in a rules or mixture file is a ConfigError, not a crash."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from factory.core.mixture import Mixture
from factory.core.rules import DomainRules
from factory.core.yamlfile import parse_yaml, read_yaml
from factory.errors import ConfigError

HOSTILE = {
    "impossible_date": "when: 2024-13-45\n",  # PyYAML raises ValueError, not YAMLError
    "recursive_alias": "a: &x [*x]\n",  # loads as a cycle
    "deep_nesting": "a: " + "[" * 5000 + "]" * 5000 + "\n",  # RecursionError
    "bad_syntax": "a: [1, 2\n",
}
LOADERS: dict[str, Callable[[Path], Any]] = {
    "rules": DomainRules.load,
    "mixture": Mixture.load,
    "read_yaml": lambda p: read_yaml(p, "file"),
}


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_yaml_is_one_config_error(tmp_path: Path, loader: str, case: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(HOSTILE[case], encoding="utf-8")
    with pytest.raises(ConfigError, match=r"is not valid YAML"):
        LOADERS[loader](path)


def test_messages_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("rules:\n  - id: [\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"rules file {path} is not valid YAML at line \d+"):
        DomainRules.load(path)
    with pytest.raises(ConfigError, match="cannot read mixture file"):
        Mixture.load(tmp_path / "missing.yaml")
    assert parse_yaml("a: 1", "text") == {"a": 1}
