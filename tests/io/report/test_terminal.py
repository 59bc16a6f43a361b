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


def _damage(out: Path, shard: str = "data/part-00001.parquet") -> Path:
    """Flip bytes in the middle of a shard: its footer and row count stay, a page breaks."""
    path = out / shard
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    path.write_bytes(bytes(data))
    return path


def test_a_damaged_shard_is_named_in_one_line_and_the_others_are_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33: ``inspect --where`` and ``report`` on a folder with a damaged shard ended
    in a 28-line ``OSError: ZSTD decompression failed`` traceback (exit 1), and
    ``inspect --n 2`` showed the intact shard's rows without a word about the other. They
    check the manifest's checksums first, as a run does: ``inspect`` names the file and
    shows the rows of the others (exit 7), ``report`` refuses in one line (exit 7)."""
    from factory.errors import EXIT_WRITE

    out = make_folder(tmp_path / "o")  # 12 rows in shards of 5: 0-4, 5-9, 10-11
    damaged = _damage(out)
    assert main(["inspect", str(out), "--n", "2"]) == EXIT_WRITE
    captured = capsys.readouterr()
    warnings = captured.err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {damaged}: damaged")
    assert "row-000" in captured.out and "row-001" in captured.out
    assert main(["inspect", str(out), "--n", "50", "--where", "outcome=refused"]) == EXIT_WRITE
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and str(damaged) in captured.err
    shown = {f"row-{i:03d}" for i in range(12) if f"row-{i:03d}" in captured.out}
    assert shown == {"row-000", "row-003"}  # the refused rows (0, 3, 6, 9) outside rows 5-9
    assert main(["report", str(out)]) == EXIT_WRITE
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {damaged}: damaged"), err
    assert "rebuilds the file from the response cache" in err[0]
    assert not (out / "report.html").exists()
    (out / "data" / "part-00002.parquet").unlink()
    assert main(["inspect", str(out), "--n", "1"]) == EXIT_WRITE
    err = capsys.readouterr().err
    assert "part-00002.parquet: listed in the manifest but not on disk" in err
