from __future__ import annotations

import json
from pathlib import Path

import datasets
import polars as pl
import pyarrow.parquet as pq
import pytest

from factory.engine.collect import Collector
from factory.engine.stages.base import make_row
from factory.errors import OutputWriteError
from factory.io import writer
from factory.io.writer import Manifest, RejectWriter, ShardWriter, write_dataset_info
from tests.helpers import collect_rows


def sharegpt(i: int) -> dict:
    return {
        "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}],
        "system": "s",
        "tools": "[]",
        "id": f"id{i}",
        "meta": "{}",
    }


def test_shards_are_bounded_and_readable(tmp_path: Path) -> None:
    w = ShardWriter(tmp_path, shard_rows=3)
    w.extend(sharegpt(i) for i in range(7))
    w.close()
    files = sorted((tmp_path / "data").glob("*.parquet"))
    assert [pq.read_metadata(f).num_rows for f in files] == [3, 3, 1]
    assert w.files == {f"data/{f.name}": n for f, n in zip(files, [3, 3, 1], strict=True)}
    assert pl.read_parquet(files[0])["id"].to_list() == ["id0", "id1", "id2"]
    ds = datasets.load_dataset("parquet", data_dir=str(tmp_path / "data"), split="train")
    assert ds.num_rows == 7
    assert not list((tmp_path / ".tmp").iterdir())


def test_a_crash_while_writing_leaves_no_partial_shard(tmp_path: Path, monkeypatch) -> None:
    def broken_write(table, where, **kw):
        Path(where).write_bytes(b"PAR1 half a file")
        raise OSError("disk full")

    w = ShardWriter(tmp_path, shard_rows=2)
    w.add(sharegpt(0))
    monkeypatch.setattr(writer.pq, "write_table", broken_write)
    with pytest.raises(OutputWriteError) as info:
        w.add(sharegpt(1))
    assert not (tmp_path / "data").exists() or not list((tmp_path / "data").iterdir())
    assert str(tmp_path / "data" / "part-00000.parquet") in str(info.value)
    assert "disk full" in str(info.value) and info.value.exit_code == 7


def test_reject_writer_and_manifest(tmp_path: Path) -> None:
    r = RejectWriter(tmp_path, shard_rows=2)
    for i in range(3):
        r.add({"reason": "invalid_json", "raw": "x" * i})
    r.close()
    lines = [
        json.loads(x)
        for f in sorted((tmp_path / "rejects").glob("*.jsonl"))
        for x in f.read_text().splitlines()
    ]
    assert [x["raw"] for x in lines] == ["", "x", "xx"]
    m = Manifest("r", "abc")
    m.reason("validate", "wrong_type")
    path = m.write(tmp_path, total=1, rejected=1)
    body = json.loads(path.read_text())
    assert body["reasons"] == {"validate": {"wrong_type": 1}} and body["totals"]["total"] == 1
    assert body["versions"]["pyarrow"]


@pytest.mark.parametrize("fmt", ["sharegpt", "alpaca"])
def test_dataset_info_entry(tmp_path: Path, fmt: str) -> None:
    info = json.loads(write_dataset_info(tmp_path, "ds", formatting=fmt).read_text())
    assert info["ds"]["file_name"] == "data" and info["ds"]["formatting"] == fmt


def test_dataset_info_of_text_action_rows_has_no_tools_column(tmp_path: Path) -> None:
    info = json.loads(write_dataset_info(tmp_path, "ds", tools=False).read_text())
    assert info["ds"]["columns"] == {"messages": "conversations", "system": "system"}
    with_tools = json.loads(write_dataset_info(tmp_path, "ds").read_text())
    assert with_tools["ds"]["columns"]["tools"] == "tools"


def row(i: int, seed: str = "s", status: str = "ok", reason: str | None = None) -> dict:
    return make_row(
        id=f"id{i}",
        seed_id=seed,
        status=status,
        reason=reason,
        stage="postprocess",
        output=json.dumps(sharegpt(i)),
        cost_usd=0.5,
        usage=json.dumps({"prompt_tokens": 10, "completion_tokens": 5}),
        llm_stage="amplify",
    )


def test_collector_accounts_for_every_row(tmp_path: Path) -> None:
    c = Collector(tmp_path, Manifest("r", "h"), dataset_name="d", target=3, per_seed_cap=2)
    kinds = collect_rows(
        tmp_path,
        c,
        [
            row(0, "a"),
            row(1, "a"),
            row(2, "a"),
            row(0, "b"),
            row(3, "b"),
            row(4, "c"),
            row(5, "c", "rejected", "wrong_type"),
            row(6, "c", "failed", "llm_timeout"),
        ],
    )
    assert kinds == [
        "accepted",
        "accepted",
        "surplus",
        "rejected",
        "accepted",
        "surplus",
        "rejected",
        "failed",
    ]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["totals"] == {
        "total": 8,
        "accepted": 3,
        "surplus": 2,
        "rejected": 2,
        "failed": 1,
    }
    assert manifest["reasons"] == {
        "dedup": {"duplicate": 1},
        "postprocess": {"llm_timeout": 1, "wrong_type": 1},
    }
    assert manifest["tokens"] == {"prompt_tokens": 80, "completion_tokens": 40, "cached_tokens": 0}
    assert manifest["cost_usd"] == 4.0
    assert len(pl.read_parquet(tmp_path / "data" / "part-00000.parquet")) == 3
    assert len(pl.read_parquet(tmp_path / "surplus" / "part-00000.parquet")) == 2
