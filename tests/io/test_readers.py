from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factory.core.formats import parse_record
from factory.core.trajectory import Trajectory
from factory.errors import ConfigError
from factory.io import readers
from factory.io.readers import (
    RAW_LIMIT,
    RawRecord,
    SeedReject,
    binary_reason,
    convert_record,
    iter_hf_records,
    iter_records,
    read_seeds,
    records_from_bytes,
    resolve_paths,
    unusable_reason,
)
from tests.conftest import ROOT as REPO_ROOT

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "seeds"
FORMATS = ("sharegpt", "openai", "hermes")


def load(name: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def for_parquet(record: dict[str, Any]) -> dict[str, Any]:
    """Arrow columns need one type: Parquet datasets keep tool specs as JSON text and
    message content as plain text (the parsed trajectory is the same)."""
    out = dict(record)
    if isinstance(out.get("tools"), list):
        out["tools"] = json.dumps(out["tools"])
    for key in ("messages", "conversations"):
        if key in out:
            out[key] = [
                {**m, "content": "".join(p["text"] for p in m["content"])}
                if isinstance(m.get("content"), list)
                else m
                for m in out[key]
            ]
    return out


def write(path: Path, records: list[Any]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    elif path.suffix == ".json":
        path.write_text(json.dumps(records), encoding="utf-8")
    else:
        rows = [for_parquet(r) for r in records]
        keys = list(dict.fromkeys(k for r in rows for k in r))  # absent columns become null
        pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), path)
    return path


def split(items: list[Trajectory | SeedReject]) -> tuple[list[Trajectory], list[SeedReject]]:
    good = [x for x in items if isinstance(x, Trajectory)]
    bad = [x for x in items if isinstance(x, SeedReject)]
    assert len(good) + len(bad) == len(items)
    return good, bad


# --- every format in every container ---------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ext", [".json", ".jsonl", ".parquet"])
def test_every_format_in_every_container(tmp_path: Path, fmt: str, ext: str) -> None:
    records = load(fmt)
    path = write(tmp_path / f"{fmt}{ext}", records)
    good, bad = split(list(read_seeds(path)))
    assert bad == []
    expected = [parse_record(r, source="x") for r in records]
    assert [t.id for t in good] == [t.id for t in expected]
    assert [t.metadata["source"] for t in good] == [f"{path}:{i}" for i in range(len(records))]
    assert {t.metadata["format"] for t in good} == {fmt}
    assert [t.metadata["repairs"] for t in good] == [t.metadata["repairs"] for t in expected]
    # the bytes path (Ray's read_binary_files) gives the same trajectories
    from_bytes = [convert_record(r) for r in records_from_bytes(str(path), path.read_bytes())]
    assert [t.id for t in from_bytes if isinstance(t, Trajectory)] == [t.id for t in good]


def test_parquet_nested_columns_become_python_objects(tmp_path: Path) -> None:
    path = write(tmp_path / "o.parquet", load("openai"))
    [raw] = list(iter_records(path))
    messages = raw.record["messages"]
    assert isinstance(messages, list) and isinstance(messages[2]["tool_calls"][0], dict)
    assert raw.record["info"] == {"task": {"user_id": "mia_li_3668"}}
    assert json.loads(raw.raw)["task_id"] == 7


def test_parquet_streams_batch_by_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "PARQUET_BATCH_ROWS", 3)
    record = load("sharegpt")[0]
    rows = [{**record, "task_id": i} for i in range(10)]
    path = write(tmp_path / "many.parquet", rows)
    got = list(iter_records(path))
    assert [r.index for r in got] == list(range(10))
    assert [r.record["task_id"] for r in got] == list(range(10))


@pytest.mark.parametrize("key", ["data", "records"])
def test_json_wrapped_list_and_single_object(tmp_path: Path, key: str) -> None:
    records = load("openai") + load("hermes")
    (tmp_path / "wrapped.json").write_text(json.dumps({key: records, "version": 1}))
    (tmp_path / "single.json").write_text(json.dumps(records[0]))
    wrapped = list(iter_records(tmp_path / "wrapped.json"))
    assert [r.record for r in wrapped] == records
    [single] = list(iter_records(tmp_path / "single.json"))
    assert single.record == records[0] and single.index == 0


# --- corrupted input -------------------------------------------------------------------


def corrupted_jsonl() -> bytes:
    good = [json.dumps(r).encode() for r in load("sharegpt") + load("openai")]
    lines = [
        good[0],  # 0
        b'{"conversations": [{"from": "human", "value": "caf\xe9"}]}',  # 1 invalid UTF-8
        good[1][: len(good[1]) // 2],  # 2 truncated JSON
        b"",  # 3 blank: skipped
        b'{"conversations": 5}',  # 4 wrong type
        b"[1, 2, 3]",  # 5 not an object
        b'{"prompt": "q", "completion": "a"}',  # 6 unknown layout
        b'{"messages": [{"role": "user", "content": 7}]}',  # 7 wrong type
        good[2] + b"\r",  # 8 CRLF line ending
    ]
    return b"\n".join(lines) + b"\n"


EXPECTED_REJECTS = [
    (1, "unreadable_bytes"),
    (2, "invalid_json"),
    (4, "bad_field_type"),
    (5, "not_an_object"),
    (6, "unknown_format"),
    (7, "bad_field_type"),
]


def test_corrupted_jsonl_rejects_bad_rows_and_keeps_good_ones(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(corrupted_jsonl())
    good, bad = split(list(read_seeds(path)))
    assert [t.metadata["source"] for t in good] == [f"{path}:0", f"{path}:8"]
    assert [(r.index, r.reason) for r in bad] == EXPECTED_REJECTS
    assert all(r.source == str(path) and r.message for r in bad)
    truncated = next(r for r in bad if r.index == 2)
    assert truncated.raw and len(truncated.raw) <= RAW_LIMIT
    assert "caf" in next(r for r in bad if r.index == 1).raw  # decoded with replacement


def test_corrupted_jsonl_from_bytes_matches_file_reader(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(corrupted_jsonl())
    from_file = [(r.index, r.error.reason if r.error else None) for r in iter_records(path)]
    from_bytes = [
        (r.index, r.error.reason if r.error else None)
        for r in records_from_bytes("bad.jsonl", corrupted_jsonl())
    ]
    assert from_file == from_bytes
    assert [i for i, _ in from_file] == [0, 1, 2, 4, 5, 6, 7, 8]


def test_over_long_line_is_skipped_without_losing_the_next(tmp_path: Path) -> None:
    record = load("openai")[0]
    line = json.dumps(record)
    path = tmp_path / "long.jsonl"
    path.write_text(
        json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}) + "\n" + line + "\n"
    )
    got = list(read_seeds(path, max_bytes=len(line) + 10))
    assert isinstance(got[0], SeedReject) and got[0].reason == "too_large"
    assert len(got[0].raw) <= RAW_LIMIT
    assert isinstance(got[1], Trajectory) and got[1].metadata["source"] == f"{path}:1"


def test_record_size_limit_applies_to_parquet_rows(tmp_path: Path) -> None:
    path = write(tmp_path / "o.parquet", load("openai"))
    [reject] = list(read_seeds(path, max_bytes=300))
    assert isinstance(reject, SeedReject) and reject.reason == "too_large"


def test_deeply_nested_line_is_too_large_not_a_crash() -> None:
    data = b"[" * 200_000 + b"]" * 200_000 + b"\n"
    [rec] = list(records_from_bytes("deep.jsonl", data, max_bytes=1_000_000))
    assert rec.error is not None and rec.error.reason == "too_large"


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("x.json", b"{not json", "invalid_json"),
        ("x.json", b'{"a": "\xff"}', "unreadable_bytes"),
        ("x.json", b"[" * 100_000, "too_large"),
        ("x.parquet", b"PAR1 definitely not parquet", "unreadable_file"),
        ("x.csv", b"a,b\n1,2\n", "unreadable_file"),
        ("noext", b"{}", "unreadable_file"),
    ],
)
def test_bad_files_become_one_error_record(name: str, data: bytes, reason: str) -> None:
    [rec] = list(records_from_bytes(name, data))
    assert rec.record is None and rec.error is not None
    assert rec.error.reason == reason
    reject = convert_record(rec)
    assert isinstance(reject, SeedReject) and reject.reason == reason


def test_truncated_parquet_file_is_reported(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet", load("sharegpt"))
    data = path.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    [reject] = list(read_seeds(tmp_path / "cut.parquet"))
    assert isinstance(reject, SeedReject) and reject.reason == "unreadable_file"


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    line = json.dumps(load("openai")[0]).encode()
    for name in ("bom.jsonl", "bom.json"):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + line + b"\n")
        [traj] = list(read_seeds(tmp_path / name))
        assert isinstance(traj, Trajectory)


def test_reject_to_dict() -> None:
    reject = SeedReject("a.jsonl", 3, "invalid_json", "bad", "{")
    assert reject.to_dict() == {
        "source": "a.jsonl",
        "index": 3,
        "reason": "invalid_json",
        "message": "bad",
        "raw": "{",
    }


# --- paths -----------------------------------------------------------------------------


def make_tree(root: Path) -> None:
    (root / "sub").mkdir()
    write(root / "b.jsonl", load("sharegpt"))
    write(root / "a.json", load("openai"))
    write(root / "sub" / "c.parquet", load("hermes"))
    (root / "notes.txt").write_text("not a seed")
    (root / ".hidden.jsonl").write_text("{}\n")


def test_directory_glob_and_list_are_sorted(tmp_path: Path) -> None:
    make_tree(tmp_path)
    names = [p.name for p in resolve_paths(tmp_path)]
    assert names == ["a.json", "b.jsonl", "c.parquet"]
    assert [p.name for p in resolve_paths(str(tmp_path / "*.json*"))] == ["a.json", "b.jsonl"]
    assert [p.name for p in resolve_paths(str(tmp_path / "**" / "*.parquet"))] == ["c.parquet"]
    listed = resolve_paths([tmp_path / "b.jsonl", str(tmp_path / "a.json")])
    assert [p.name for p in listed] == ["b.jsonl", "a.json"]
    good, bad = split(list(read_seeds(tmp_path)))
    assert bad == [] and len(good) == 5
    assert [t.metadata["format"] for t in good] == [
        "openai",
        "sharegpt",
        "sharegpt",
        "hermes",
        "hermes",
    ]


@pytest.mark.parametrize("spec", ["missing.jsonl", "nothing-*.jsonl", "empty_dir"])
def test_spec_matching_no_file_is_a_config_error(tmp_path: Path, spec: str) -> None:
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ConfigError) as info:
        list(read_seeds(tmp_path / spec))
    assert info.value.key_path == "seeds"


def test_explicit_file_with_unknown_extension_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "seeds.txt").write_text("hello")
    [reject] = list(read_seeds(tmp_path / "seeds.txt"))
    assert isinstance(reject, SeedReject) and reject.reason == "unreadable_file"


def test_default_tools_reach_every_record(tmp_path: Path) -> None:
    tools = load("openai")[0]["tools"]
    record = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    path = write(tmp_path / "t.jsonl", [record, record])
    got = list(read_seeds(path, default_tools=tools))
    assert all(isinstance(t, Trajectory) and len(t.tools) == len(tools) for t in got)


# --- Hugging Face datasets (local files only, never the hub) ---------------------------


@pytest.mark.parametrize("ext", [".jsonl", ".parquet"])
def test_iter_hf_records_local(tmp_path: Path, ext: str) -> None:
    records = load("sharegpt")
    path = write(tmp_path / f"s{ext}", records)
    got = list(iter_hf_records(str(path)))
    assert [r.index for r in got] == [0, 1]
    assert all(r.error is None and r.source == str(path) for r in got)
    trajs = [convert_record(r) for r in got]
    expected = [parse_record(r, source="x").id for r in records]
    assert [t.id for t in trajs if isinstance(t, Trajectory)] == expected


def test_iter_hf_records_refuses_mixed_containers(tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl", load("sharegpt"))
    write(tmp_path / "b.parquet", load("sharegpt"))
    with pytest.raises(ConfigError):
        list(iter_hf_records(str(tmp_path)))


# --- properties: bad bytes never raise -------------------------------------------------

CONTAINER_NAMES = st.sampled_from(["r.jsonl", "r.ndjson", "r.json", "r.parquet", "r.bin"])
GOOD_LINE = json.dumps(load("sharegpt")[0]).encode()


@settings(max_examples=150, deadline=None)
@given(CONTAINER_NAMES, st.binary(max_size=300))
def test_random_bytes_never_raise(name: str, data: bytes) -> None:
    for raw in records_from_bytes(name, data):
        assert isinstance(raw, RawRecord)
        assert isinstance(convert_record(raw), (Trajectory, SeedReject))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, len(GOOD_LINE) - 1), st.binary(min_size=0, max_size=3)),
        max_size=4,
    ),
    st.integers(1, len(GOOD_LINE)),
)
def test_mutated_jsonl_file_never_raises(edits: list[tuple[int, bytes]], cut: int) -> None:
    line = bytearray(GOOD_LINE)
    for pos, chunk in edits:
        line[pos : pos + len(chunk)] = chunk
    data = bytes(line[:cut]) + b"\n" + GOOD_LINE + b"\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.jsonl"
        path.write_bytes(data)
        got = list(read_seeds(path))
    assert isinstance(got[-1], Trajectory)  # the intact line after the damage survives
    assert all(isinstance(x, (Trajectory, SeedReject)) for x in got)


# --- files that are not seed files at all --------------------------------------------------


@pytest.mark.parametrize(
    ("head", "words"),
    [
        (b"", "not text"),  # random bytes
        (b"\x1f\x8b\x08\x00", "gzip"),
        (b"PAR1", "Parquet"),
    ],
)
def test_binary_jsonl_is_one_reject_and_read_no_further(head: bytes, words: str) -> None:
    data = head + random.Random(1).randbytes(2_000_000)  # ~8,000 "lines" of garbage
    got = list(records_from_bytes("garbage.jsonl", data))
    assert len(got) == 1 and got[0].error is not None
    assert got[0].error.reason == "unreadable_file" and words in str(got[0].error)
    assert len(got[0].raw) <= 400


def test_a_few_broken_bytes_keep_a_file_textual() -> None:
    """Broken lines in a text file stay one reject each (the hostile-input contract)."""
    good = json.dumps(load("sharegpt")[0]).encode()
    data = b"\n".join([good, b"\xff\xfe not utf-8 \x80", b"\x00{", good]) + b"\n"
    assert binary_reason(data) is None
    got = [r.error.reason if r.error else None for r in records_from_bytes("t.jsonl", data)]
    assert got == [None, "unreadable_bytes", "invalid_json", None]


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("s.csv", b"a,b\n1,2\n", "CSV"),
        ("s.txt", b'{"conversations": []}\n', "name it .jsonl"),
        ("e.jsonl", b"", "empty"),
        ("blank.jsonl", b"\n \n", "blank"),
        ("r.jsonl", bytes(range(256)) * 400, "not text"),
        ("r.json", b"\x00\x01" * 1000, "not text"),
        ("x.jsonl", b'{"a": 1}\n"text"\n{broken\n', "none of its first 3 records"),
        ("x.parquet", b"PAR1 not really", "unreadable Parquet"),
    ],
)
def test_unusable_reason_names_what_is_wrong(
    tmp_path: Path, name: str, data: bytes, words: str
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    why = unusable_reason(path)
    assert why is not None and words in why, why


@pytest.mark.parametrize("ext", [".json", ".jsonl", ".parquet"])
def test_unusable_reason_accepts_a_file_whose_later_records_are_bad(
    tmp_path: Path, ext: str
) -> None:
    path = write(tmp_path / f"s{ext}", [*load("openai"), {"junk": 1}])
    assert unusable_reason(path) is None
    bad_first = tmp_path / "later.jsonl"
    bad_first.write_text('{"junk": 1}\n' + json.dumps(load("openai")[0]) + "\n")
    assert unusable_reason(bad_first) is None


@pytest.mark.parametrize("first", [b"BZh", b"BZh9 is a grade", b"PAR1 was the first part"])
def test_a_text_line_that_begins_like_a_compressed_file_is_not_taken_for_one(
    tmp_path: Path, first: bytes
) -> None:
    """bzip2's and Parquet's magic numbers are ASCII: a damaged first line that begins
    with one is a reject of its own, and the intact lines after it are read (the fuzz
    test's counterexample: ``edits=[(0, b'BZh')], cut=3``)."""
    path = tmp_path / "m.jsonl"
    path.write_bytes(first + b"\n" + GOOD_LINE + b"\n")
    got = list(read_seeds(path))
    assert isinstance(got[-1], Trajectory)


def test_real_bzip2_and_parquet_files_are_still_named(tmp_path: Path) -> None:
    import bz2

    path = tmp_path / "s.jsonl"
    path.write_bytes(bz2.compress(GOOD_LINE + b"\n"))
    (reject,) = list(read_seeds(path))
    assert isinstance(reject, SeedReject) and "bzip2" in reject.message
    table = pa.table({"a": [1, 2]})
    pq.write_table(table, tmp_path / "t.parquet")
    (tmp_path / "t.parquet").rename(tmp_path / "p.jsonl")
    (reject,) = list(read_seeds(tmp_path / "p.jsonl"))
    assert isinstance(reject, SeedReject) and "Parquet" in reject.message
