"""``factory inspect``: rows rendered as a person reads them in a terminal."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from factory.cli import main
from factory.errors import ConfigError
from factory.io.report.folder import OutputFolder, parse_where
from factory.io.report.terminal import inspect_folder
from tests.helpers.reportfolder import make_folder


def _render(out: Path, **kw) -> str:
    console = Console(record=True, width=110, color_system=None)
    inspect_folder(OutputFolder(out), console, **kw)
    return console.export_text()


def test_rows_read_as_conversations(tmp_path: Path) -> None:
    text = _render(make_folder(tmp_path / "o"), n=2)
    assert "row-000" in text and "row-001" in text and "row-002" not in text
    assert "user: Hi, I am user_0 and I want to cancel booking R000." in text
    assert 'tool call: get_user_details({"user_id": "user_0"})' in text
    assert "tool result:" in text and "assistant: Sorry, this booking cannot be cancelled." in text
    assert "seed_id=seed-0" in text and "outcome=refused" in text  # provenance and labels


def test_where_filters_on_labels_and_meta(tmp_path: Path) -> None:
    out = make_folder(tmp_path / "o")
    text = _render(out, n=50, where=parse_where(["outcome=refused"]))
    shown = [line for line in text.splitlines() if "row-0" in line and "─" in line]
    assert len(shown) == 4  # rows 0, 3, 6, 9 of 12
    assert "outcome=completed" not in text
    text = _render(out, n=50, where=parse_where(["seed_id=seed-1", "labels.outcome=completed"]))
    assert "row-001" in text and "row-004" in text and "row-000" not in text
    assert "no accepted rows where outcome=lost" in _render(
        out, where=parse_where(["outcome=lost"])
    )


def test_a_where_key_no_row_has_is_named_with_the_keys_there_are(tmp_path: Path) -> None:
    # Issue 39: `--where outcom=refused` answered "no accepted rows where outcom=refused".
    out = make_folder(tmp_path / "o")
    with pytest.raises(ConfigError) as info:
        _render(out, where=parse_where(["outcom=refused"]))
    message = str(info.value)
    assert message.startswith("--where outcom: no key outcom in the rows of")
    assert "did you mean outcome?" in message and "seed_id" in message
    with pytest.raises(ConfigError, match=r"did you mean labels\.outcome"):
        _render(out, where=parse_where(["labels.outcom=refused"]))
    with pytest.raises(ConfigError, match="did you mean reason"):
        _render(out, rejects="all", where=parse_where(["reasn=unknown_tool"]))
    # A known key with no match is still "no rows", not an error.
    assert "no accepted rows where outcome=lost" in _render(
        out, where=parse_where(["outcome=lost"])
    )


def test_rejects_show_stage_reason_and_message(tmp_path: Path) -> None:
    out = make_folder(tmp_path / "o")
    text = _render(out, rejects="unknown_tool")
    assert "postprocess: unknown_tool" in text and "call 2 could not be used" in text
    assert "malformed_json" not in text
    missing = _render(out, rejects="near_duplicate")
    assert "no rejected rows with reason near_duplicate" in missing
    assert "reasons in this folder: malformed_json, unknown_tool" in missing


def test_the_command_prints_rows_and_errors_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = make_folder(tmp_path / "o")
    assert main(["inspect", str(out), "--n", "1", "--where", "outcome=completed"]) == 0
    assert "row-001" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "nothing")]) == ConfigError.exit_code
    assert "no manifest.json" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_where(["outcome"])


def test_labels_are_never_cut_in_a_narrow_terminal(tmp_path: Path) -> None:
    out = make_folder(tmp_path / "o")
    console = Console(record=True, width=40, color_system=None)
    inspect_folder(OutputFolder(out), console, n=1)
    text = " ".join(console.export_text().split())  # the labels may wrap, never be cut
    for label in ("seed_id=seed-0", "variation=0", "outcome=refused", "group=Failure",
                  "arg_cardinality=1", "calls=1"):  # fmt: skip
        assert label in text.replace("│ ", "").replace(" │", ""), label
