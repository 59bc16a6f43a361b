"""An output on object storage: the order of uploads and deletes (factory/io/mirror.py), the
output location rules (factory/io/objectstore.py) and seeds read from a store
(factory/io/readers.py), against a real S3-compatible server on 127.0.0.1 (moto)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory.errors import ConfigError
from factory.io.mirror import Mirror, mirror_dir, plan_sync, pull_names, reading_remote, syncable
from factory.io.objectstore import ObjectStoreError, S3Store, output_location
from factory.io.readers import iter_records, resolve_paths, unusable_reason
from tests.conftest import TAUBENCH
from tests.helpers import s3


def test_the_manifest_is_uploaded_after_what_it_lists_and_run_json_last() -> None:
    local = {
        "run.json": (10, 2),
        "manifest.json": (10, 2),
        "data/part-00000.parquet": (5, 1),
        "report.html": (3, 1),
        "logs/run.log": (9, 9),
        ".tmp/x-part.parquet": (1, 1),
        "unstored/.reserve": (16, 1),
    }
    plan = plan_sync(local, {}, set())
    assert plan.uploads == ("data/part-00000.parquet", "report.html", "manifest.json", "run.json")
    assert plan.deletes == ()
    # the log goes up only at the last pass; what did not change is not sent again
    uploaded = {rel: local[rel] for rel in plan.uploads}
    assert plan_sync(local, uploaded, set(plan.uploads), final=True).uploads == ("logs/run.log",)


def test_deleted_files_go_from_the_store_manifest_first() -> None:
    remote = {"manifest.json", "data/part-00000.parquet", "rejects/part-00000.jsonl", "run.json"}
    local = {"run.json": (1, 2)}
    plan = plan_sync(local, {"run.json": (1, 1)}, remote)
    assert plan.deletes == ("manifest.json", "data/part-00000.parquet", "rejects/part-00000.jsonl")
    assert plan.uploads == ("run.json",)
    # the cache and the lease below the prefix are never the mirror's to delete
    assert plan_sync({}, {}, {"cache/w-00000000.jsonl", ".lease"}).deletes == ()


def test_a_start_downloads_the_shards_only_of_a_finished_run() -> None:
    remote = {
        "run.json": 1,
        "manifest.json": 1,
        "data/part-00000.parquet": 1,
        "report.html": 1,
        "prompts.json": 1,
        "unstored/1-2-3.jsonl": 1,
        "card.json": 1,
        "cache/w-00000000.jsonl": 1,
        ".lease": 1,
    }
    kept = ["card.json", "prompts.json", "run.json", "unstored/1-2-3.jsonl"]
    assert pull_names(remote, done=False) == kept
    assert pull_names(remote, done=True) == sorted(
        [*kept, "manifest.json", "data/part-00000.parquet", "report.html"]
    )
    assert not syncable("cache/x.jsonl") and not syncable(".tmp/a") and syncable("data/a")


def test_output_locations(tmp_path: Path) -> None:
    assert output_location("s3://bkt/a/b/") == "s3://bkt/a/b"
    assert output_location(f"file://{tmp_path}/o") == tmp_path / "o"
    assert output_location("out") == Path("out").resolve()
    with pytest.raises(ConfigError, match=r"gs://.*conditional write") as gs:
        output_location("gs://bkt/out")
    assert gs.value.key_path == "output.dir"
    with pytest.raises(ConfigError, match="AWS_ENDPOINT_URL"):
        output_location("s3://bkt/out?endpoint_override=127.0.0.1:9000")
    a, b = mirror_dir("s3://bkt/run"), mirror_dir("s3://bkt/run2")
    assert a != b and a.parent == b.parent


def test_mirror_pulls_a_stopped_run_and_the_store_follows_the_folder(tmp_path: Path) -> None:
    uri = f"s3://{s3.new_bucket()}/runs/a"
    store = S3Store(uri, s3.client())
    for rel, body in {
        "run.json": json.dumps({"status": "stopped"}).encode(),
        "manifest.json": b"{}",
        "data/part-00000.parquet": b"old shard",
        "prompts.json": b"{}",
        "cache/w-00000000.jsonl": b"paid",
    }.items():
        store.put(rel, body)
    calls: list[tuple[str, str]] = []
    put, delete, upload = store.put, store.delete, store.upload
    store.put = lambda rel, data, **kw: calls.append(("put", rel)) or put(rel, data, **kw)  # type: ignore[method-assign]
    store.delete = lambda rel, **kw: calls.append(("delete", rel)) or delete(rel, **kw)  # type: ignore[method-assign]
    store.upload = lambda rel, path: calls.append(("put", rel)) or upload(rel, path)  # type: ignore[method-assign]

    mirror = Mirror(store, tmp_path / "m")
    assert mirror.pull() == "stopped"
    assert sorted(p.name for p in mirror.local.rglob("*") if p.is_file()) == [
        "prompts.json",
        "run.json",
    ]
    (mirror.local / "run.json").write_text(json.dumps({"status": "running"}))
    plan = mirror.sync()
    assert calls == [
        ("delete", "manifest.json"),
        ("delete", "data/part-00000.parquet"),
        ("put", "run.json"),
    ]
    assert plan.uploads == ("run.json",)
    calls.clear()
    (mirror.local / "data").mkdir()
    (mirror.local / "data" / "part-00000.parquet").write_bytes(b"new shard")
    (mirror.local / "manifest.json").write_text('{"files": {"data/part-00000.parquet": 1}}')
    os.utime(mirror.local / "run.json", ns=(time.time_ns(), time.time_ns()))
    mirror.sync()
    assert calls == [
        ("put", "data/part-00000.parquet"),
        ("put", "manifest.json"),
        ("put", "run.json"),
    ]
    assert mirror.sync().uploads == ()  # nothing changed, nothing sent
    assert store.get("data/part-00000.parquet").data == b"new shard"
    assert store.get("cache/w-00000000.jsonl").data == b"paid"  # the cache is not the mirror's

    with reading_remote(uri) as copy:
        assert (copy / "data" / "part-00000.parquet").read_bytes() == b"new shard"
        assert not (copy / "cache").exists()


def test_a_store_error_names_the_object_and_never_the_credentials() -> None:
    store = S3Store("s3://no-such-bucket-here/out", s3.client())
    with pytest.raises(ObjectStoreError) as failed:
        store.put("run.json", b"{}")
    text = str(failed.value)
    assert "s3://no-such-bucket-here/out/run.json" in text and "NoSuchBucket" in text
    assert s3.ENV["AWS_ACCESS_KEY_ID"] not in text and s3.ENV["AWS_SECRET_ACCESS_KEY"] not in text
    assert failed.value.exit_code == 7


def test_seeds_are_read_streamed_from_a_store_by_file_folder_and_glob(tmp_path: Path) -> None:
    if not TAUBENCH.is_dir():
        pytest.skip("reference data absent")
    bucket = s3.new_bucket()
    store = S3Store(f"s3://{bucket}/seeds", s3.client())
    source = next(p for p in sorted(TAUBENCH.rglob("*.json*")) if unusable_reason(p) is None)
    records = list(iter_records(source))
    lines = b"".join(json.dumps(r.record).encode() + b"\n" for r in records[:30])
    store.put("a/one.jsonl", lines)
    table = pa.Table.from_pylist([{"messages": json.dumps(r.record)} for r in records[:3]])
    pq.write_table(table, tmp_path / "t.parquet")
    store.upload("b/two.parquet", tmp_path / "t.parquet")
    store.put("b/notes.txt", b"not a seed")

    base = f"s3://{bucket}/seeds"
    assert resolve_paths(base) == [f"{base}/a/one.jsonl", f"{base}/b/two.parquet"]
    assert resolve_paths(f"{base}/*/*.jsonl") == [f"{base}/a/one.jsonl"]
    assert unusable_reason(f"{base}/a/one.jsonl") is None
    assert "unsupported extension" in (unusable_reason(f"{base}/b/notes.txt") or "")
    got = [r.record for r in iter_records(f"{base}/a/one.jsonl")]
    assert got == [r.record for r in records[:30]]
    assert len(list(iter_records(f"{base}/b/two.parquet"))) == 3
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_paths(f"{base}/missing.jsonl")


def test_a_run_that_lost_its_lease_writes_nothing_more(tmp_path: Path) -> None:
    from factory.errors import OutputLocked
    from factory.io.lease import Lease

    uri = f"s3://{s3.new_bucket()}/runs/l"
    store = S3Store(uri, s3.client())
    lease = Lease(store, ttl_s=30)
    lease.acquire()
    mirror = Mirror(store, tmp_path / "m", lease)
    mirror.pull()
    (mirror.local / "run.json").write_text("{}")
    mirror.sync()
    store.put(".lease", b"another run took it")  # its next renewal finds another version
    assert lease.renew() is False
    (mirror.local / "report.html").write_text("late")
    with pytest.raises(OutputLocked, match="taken by another run"):
        mirror.sync()
    assert "report.html" not in store.list()
