"""``factory``: one command for every tool, its ``--help`` the one docs/cli.md quotes."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from factory import cli
from factory.cli import COMMANDS, build_parser, main
from tests.conftest import ROOT


def _documented_help() -> str:
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    block = re.search(r"```text\n\$ factory --help\n(.*?)```", text, re.S)
    assert block, "docs/cli.md must quote `factory --help` in a ```text block"
    return block.group(1)


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_help_matches_the_docs() -> None:
    assert _squash(build_parser().format_help()) == _squash(_documented_help())


def test_every_command_is_listed_and_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert list(COMMANDS) == [
        "run", "inspect", "report", "push", "evaluate", "fidelity", "devserver", "bench", "domain"
    ]  # fmt: skip
    listed = build_parser().format_help()
    for name in COMMANDS:
        assert re.search(rf"^\s+{name}\s", listed, re.M), name
    for name in ("run", "inspect", "report", "push", "evaluate", "devserver", "bench"):
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0, name
        assert "usage:" in capsys.readouterr().out


def test_run_is_the_same_command_as_python_m_factory_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A dry run: reads the recipe and the seeds, calls nothing, starts no Ray.
    assert main(["run", "airline.yaml", "--dry-run", "--json"]) == 0
    plan = capsys.readouterr().out
    assert '"seeds"' in plan
    code = main(["run", str(tmp_path / "missing.yaml")])
    assert code == 2 and "missing.yaml" in capsys.readouterr().err


def test_domain_dispatches_to_its_module_or_says_it_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(COMMANDS, "domain", ("domain tools", "factory_no_such_module"))
    assert main(["domain", "list"]) == 2
    assert "`factory domain` is not available" in capsys.readouterr().err
    (tmp_path / "fake_domain_cli.py").write_text(
        "seen = []\ndef main(argv):\n    seen.append(argv)\n    return 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(COMMANDS, "domain", ("domain tools", "fake_domain_cli"))
    assert main(["domain", "new", "retail"]) == 3
    import fake_domain_cli  # type: ignore[import-not-found]

    assert fake_domain_cli.seen == [["new", "retail"]]


@pytest.mark.slow
def test_the_console_script_and_python_m_factory() -> None:
    (script,) = entry_points(group="console_scripts", name="factory")
    assert script.value == "factory.cli:entry"
    assert cli.entry.__module__ == "factory.cli"
    done = subprocess.run(
        [sys.executable, "-m", "factory", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and _squash(done.stdout) == _squash(_documented_help())


@pytest.mark.parametrize("name", ["domain", "run"])
def test_a_delegated_command_names_itself_as_called(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: factory {name} ") and "python -m" not in out
