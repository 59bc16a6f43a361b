"""The generic plug-in registry: declarations, hand registrations, load errors, reset.

Plug-ins live in a real installed distribution as far as ``importlib.metadata``
is concerned: a module and a ``*.dist-info`` folder with ``entry_points.txt`` on
a temporary ``sys.path``, the way ``pip install`` leaves one.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from factory.core.plugins import PluginRegistry
from factory.errors import ConfigError
from tests.conftest import install_distribution, site_on_path

GROUP = "factory.test_widgets"


@dataclass(frozen=True)
class Widget:
    name: str


GOLD = Widget("gold")  # a built-in: tests.core.test_plugins:GOLD


_MODULE = """
from tests.core.test_plugins import Widget

blue = Widget("blue")
def make_red():
    return Widget("red")
misnamed = Widget("green")
not_a_widget = 42
"""


def _install(site: Path, dist: str, module: str, points: dict[str, str]) -> None:
    (site / f"{module}.py").write_text(_MODULE, encoding="utf-8")
    install_distribution(site, dist, GROUP, points)


@pytest.fixture()
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    yield site_on_path(tmp_path / "site", monkeypatch)
    for name in [m for m in sys.modules if m.startswith("widgets_")]:
        del sys.modules[name]


def registry(builtins: dict[str, str] | None = None) -> PluginRegistry[Widget]:
    return PluginRegistry(GROUP, "widget", "widgets.kind", Widget, builtins)


def test_entry_points_and_builtins_load_lazily_and_once(site: Path) -> None:
    _install(
        site, "widgets_a", "widgets_a", {"blue": "widgets_a:blue", "red": "widgets_a:make_red"}
    )
    reg = registry({"gold": "tests.core.test_plugins:GOLD"})
    assert reg.names() == ["blue", "gold", "red"]
    assert "widgets_a" not in sys.modules  # names come from metadata alone
    blue = reg.find("blue")
    assert blue == Widget("blue") and reg.find("blue") is blue
    assert reg.find("red") == Widget("red")  # a function returning a plug-in
    assert reg.find("gold") is GOLD
    assert reg.find("nothing") is None  # the caller words the unknown-name error


def test_one_distribution_seen_twice_is_one_declaration(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(site, "widgets_a", "widgets_a", {"blue": "widgets_a:blue"})
    again = site_on_path(site / "again", monkeypatch)
    install_distribution(again, "widgets_a", GROUP, {"blue": "widgets_a:blue"})
    assert registry().find("blue") == Widget("blue")


def test_a_name_declared_by_two_packages_is_an_error_naming_both(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _install(site, "widgets_a", "widgets_a", {"blue": "widgets_a:blue"})
    other = site_on_path(site / "b", monkeypatch)
    _install(other, "widgets_b", "widgets_b", {"blue": "widgets_b:blue"})
    with pytest.raises(ConfigError, match="declared more than once") as info:
        registry().find("blue")
    assert "widgets_a:blue" in str(info.value) and "widgets_b:blue" in str(info.value)
    assert info.value.key_path == "widgets.kind"


def test_a_builtin_and_an_entry_point_of_one_name_clash(site: Path) -> None:
    _install(site, "widgets_a", "widgets_a", {"gold": "widgets_a:blue"})
    with pytest.raises(ConfigError, match="'gold' is declared more than once"):
        registry({"gold": "tests.core.test_plugins:GOLD"}).find("gold")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("widgets_a:nowhere", "widget 'blue': cannot load entry point widgets_a:nowhere: "),
        ("widgets_none:blue", "cannot load entry point widgets_none:blue: ModuleNotFoundError"),
        ("widgets_a:not_a_widget", "entry point widgets_a:not_a_widget gives int, not a Widget"),
        ("widgets_a:misnamed", r"widget 'blue' \(widgets_a:misnamed\) names its plug-in 'green'"),
    ],
)
def test_a_broken_plugin_is_an_error_naming_it_and_hides_no_other(
    site: Path, value: str, message: str
) -> None:
    _install(site, "widgets_a", "widgets_a", {"blue": value, "red": "widgets_a:make_red"})
    reg = registry()
    with pytest.raises(ConfigError, match=message) as info:
        reg.find("blue")
    assert info.value.key_path == "widgets.kind"
    assert reg.find("red") == Widget("red")


def test_an_import_error_is_chained_and_its_text_truncated(site: Path) -> None:
    (site / "widgets_loud.py").write_text(f"raise RuntimeError({'x' * 5000!r})\n", "utf-8")
    _install(site, "widgets_a", "widgets_a", {"blue": "widgets_loud:blue"})
    with pytest.raises(
        ConfigError, match=r"RuntimeError: x{200}\.\.\. \[4800 more chars\]"
    ) as info:
        registry().find("blue")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_a_name_registered_twice_needs_replace(site: Path) -> None:
    _install(site, "widgets_a", "widgets_a", {"blue": "widgets_a:blue"})
    reg = registry()
    mine = Widget("mine")
    reg.register(mine)
    with pytest.raises(ConfigError, match="widget 'mine' is already registered") as info:
        reg.register(Widget("mine"))
    assert info.value.key_path == "widgets.kind"
    with pytest.raises(ConfigError, match="widget 'blue' is already registered"):
        reg.register(Widget("blue"))  # declared names are taken too
    assert reg.find("mine") is mine
    ours = Widget("blue")
    reg.register(ours, replace=True)
    assert reg.find("blue") is ours  # a hand registration wins over the entry point


def test_reset_forgets_registrations_and_rereads_the_entry_points(site: Path) -> None:
    reg = registry()
    reg.register(Widget("mine"))
    assert reg.names() == ["mine"]
    _install(site, "widgets_a", "widgets_a", {"blue": "widgets_a:blue"})
    importlib.invalidate_caches()
    assert reg.names() == ["mine"]  # metadata is read once
    reg.reset()
    assert reg.names() == ["blue"]
    assert reg.find("mine") is None
