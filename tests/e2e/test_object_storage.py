"""A run whose seeds, output and response cache are on object storage (issue 33, items 3-4).

Against a real S3-compatible server on 127.0.0.1 (moto, ``tests/helpers/s3.py``), one run
per promise:

* a run reads its seeds from the store and writes its shards, manifest, report, dataset
  card and LLaMA-Factory files there; ``factory inspect``/``report`` read them there; a
  second run verifies the checksums and says "already complete", and a damaged shard on
  the store is found and rebuilt from the cache on the store;
* the head is lost mid-run (``kill -9`` of the driver's whole process group: the driver
  and the Ray head it started), a second run on the same prefix was refused while the
  first lived, and a new head (another Ray, another working folder, nothing of the
  first's disk) runs the same command once the lost run's lease expired: it takes the
  lease over and ends with shards byte-identical to an uninterrupted run;
* the credentials never reach the store's files, the logs, the console or Ray's job
  records.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from factory.io.lease import LEASE_FILE, is_expired
from factory.io.objectstore import S3Store
from tests.conftest import ROOT
from tests.e2e.test_output_folder import paused
from tests.helpers import cli_args, dev_overrides, ray_log_files, s3

pytestmark = pytest.mark.ray

# Before any test starts Ray: local Ray workers inherit the environment of the session.
s3.use_s3()


_RAY_DIRS: list[str] = []


@pytest.fixture(autouse=True)
def _remove_ray_dirs():  # type: ignore[no-untyped-def]
    """The heads' Ray temp dirs (short paths under /tmp) go when the test ends."""
    yield
    while _RAY_DIRS:
        shutil.rmtree(_RAY_DIRS.pop(), ignore_errors=True)


def _env(tmp: Path, head: str) -> dict[str, str]:
    """A head of its own: its Ray temp dir and its working folder for remote outputs."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "RAY_ADDRESS")}
    env.update(s3.ENV)
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix=f"o{head}", dir="/tmp")
    _RAY_DIRS.append(env["RAY_TMPDIR"])
    env["FACTORY_MIRROR_DIR"] = str(tmp / f"work-{head}")
    return env


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _shards(files: dict[str, bytes]) -> dict[str, str]:
    return {rel: _sha(data) for rel, data in files.items() if rel.startswith("data/")}


def _local(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*.parquet")}


def _upload_seeds(bucket: str) -> str:
    store = S3Store(f"s3://{bucket}", s3.client())
    for f in sorted((ROOT / "seeds" / "airline").glob("*.jsonl")):
        store.upload(f"seeds/{f.name}", f)
    return f"s3://{bucket}/seeds/*.jsonl"


def test_a_run_writes_its_dataset_to_the_store_and_commands_read_it_there(
    devserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from factory.cli import main as factory

    server = devserver(seed=21)
    bucket = s3.new_bucket()
    out = f"s3://{bucket}/runs/a"
    seeds = _upload_seeds(bucket)
    args = cli_args(out, *dev_overrides(server.url, target=20), f"seeds.path={seeds}")  # type: ignore[arg-type]
    env = _env(tmp_path, "a")
    first = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"output: {out}" in first.stdout
    assert f"report: {out}/report.html" in first.stdout

    remote = s3.objects(out)
    for name in ("run.json", "manifest.json", "dataset_info.json", "report.html", "README.md"):
        assert name in remote, name
    assert "llamafactory/sft.yaml" in remote and "logs/run.log" in remote
    assert LEASE_FILE not in remote, "the lease is released when the run ends"
    assert any(rel.startswith("cache/") for rel in remote), "the cache lives on the store"
    manifest = json.loads(remote["manifest.json"])
    assert manifest["totals"]["accepted"] == 20
    assert {r for r in remote if r.startswith("data/")} == {
        r for r in manifest["files"] if r.startswith("data/")
    }
    for rel, digest in manifest["checksums"].items():
        assert _sha(remote[rel]) == digest, rel
    assert json.loads(remote["run.json"])["status"] == "done"
    assert not any(Path(env["FACTORY_MIRROR_DIR"]).glob("*/*")), "the working copy is deleted"

    # The commands read the output where it is.
    capsys.readouterr()
    assert factory(["inspect", out, "--n", "2"]) == 0
    assert "assistant" in capsys.readouterr().out
    before = remote["report.html"]
    assert factory(["report", out, "--license", "mit"]) == 0
    assert f"{out}/README.md" in capsys.readouterr().out
    after = s3.objects(out)
    assert "license: mit" in after["README.md"].decode() and after["report.html"] != b""
    assert after["manifest.json"] == remote["manifest.json"] and before

    # Again: the shards on the store are checked against their checksums first.
    again = subprocess.run(args, env=_env(tmp_path, "b"), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already complete" in again.stdout
    # A shard damaged on the store is found and written again from the cache on the store.
    shard = sorted(_shards(remote))[0]
    damaged = bytearray(remote[shard])
    damaged[len(damaged) // 2] ^= 0xFF
    S3Store(out, s3.client()).put(shard, bytes(damaged))
    calls = server.stats()["requests"]
    fixed = subprocess.run(args, env=_env(tmp_path, "c"), capture_output=True, text=True)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "damaged" in fixed.stdout + fixed.stderr
    assert _shards(s3.objects(out)) == _shards(remote)
    assert server.stats()["requests"] == calls, "a rebuild from the cache pays nothing"


# Few slots, slow answers: the run is mid-flight for seconds (shards of 15 rows: several).
SLOW = ("llm.concurrency=4", "llm.per_actor_concurrency=2", "output.shard_rows=15")


def _wait(condition, what: str, deadline_s: float = 600) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.timeout(1800)
def test_a_lost_head_is_resumed_from_another_head_byte_identical(devserver, tmp_path: Path) -> None:
    # The uninterrupted run, into a local folder.
    ref_server = devserver(seed=22, latency_ms=300)
    ref = tmp_path / "ref"
    overrides = [*dev_overrides(ref_server.url, target=60), *SLOW]
    done = subprocess.run(
        cli_args(ref, *overrides), env=_env(tmp_path, "r"), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]

    server = devserver(seed=22, latency_ms=300)
    bucket = s3.new_bucket()
    out = f"s3://{bucket}/runs/k"
    store = S3Store(out, s3.client())
    overrides = [*dev_overrides(server.url, target=60), *SLOW]
    args = cli_args(out, *overrides, "output.lease_ttl_s=3")  # type: ignore[arg-type]
    env_a = _env(tmp_path, "a")
    with (tmp_path / "head-a.err").open("w") as err_a:
        head_a = subprocess.Popen(
            args, env=env_a, stdout=subprocess.DEVNULL, stderr=err_a, start_new_session=True
        )
    try:
        # Lost once the cache on the store holds answers: paid work to keep.
        _wait(
            lambda: head_a.poll() is not None or any(r.startswith("cache/") for r in store.list()),
            "answers in the cache on the store",
        )
        with paused(server):  # the run stays mid-flight however long this takes
            err = (tmp_path / "head-a.err").read_text()[-2000:]
            assert head_a.poll() is None, f"the run ended before its head was lost: {err}"
            # A second run on the same prefix is refused while the first lives.
            second = subprocess.run(
                args, env=_env(tmp_path, "2"), capture_output=True, text=True, timeout=300
            )
            assert second.returncode == 6, second.stderr[-2000:]
            assert "in use by another run" in second.stderr
            assert f"pid {head_a.pid}" in second.stderr
            tree = psutil.Process(head_a.pid).children(recursive=True)  # its Ray head, workers
            os.killpg(head_a.pid, signal.SIGKILL)  # the head is lost: driver and Ray at once
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head_a.pid, signal.SIGKILL)
        head_a.wait()
    _, alive = psutil.wait_procs(tree, timeout=90)
    assert not alive, f"processes of the lost head outlived it: {alive}"
    assert json.loads(store.get("run.json").data)["status"] == "running"
    # Nothing of the lost head's disk is used again.
    shutil.rmtree(env_a["FACTORY_MIRROR_DIR"], ignore_errors=True)
    shutil.rmtree(env_a["RAY_TMPDIR"], ignore_errors=True)

    # The lost run's lease expires on the store's clock; a new head then takes it over.
    def expired() -> bool:
        blob = store.get(LEASE_FILE)
        return is_expired(blob.modified, 3, blob.server_now)

    _wait(expired, "the lost run's lease to expire", 120)
    resumed = subprocess.run(
        args, env=_env(tmp_path, "b"), capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "took over the expired lease" in resumed.stderr
    remote = s3.objects(out)
    assert _shards(remote) == _shards(_local(ref)), "not byte-identical to an uninterrupted run"
    assert LEASE_FILE not in remote
    manifest = json.loads(remote["manifest.json"])
    assert manifest["responses_from_cache"] > 0, "the new head reused the answers on the store"


def test_credentials_never_reach_outputs_logs_or_rays_job_records(
    ray_session,
    devserver,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    from factory.engine.runner import run
    from tests.helpers import recipe

    caplog.set_level(logging.DEBUG)
    s3.start_server()
    server = devserver(seed=23)
    out = f"s3://{s3.new_bucket()}/runs/s"
    cfg = recipe("airline.yaml", out, *dev_overrides(server.url, target=10))  # type: ignore[arg-type]
    caplog.clear()  # the records of the run itself, not of this test's own S3 client
    result = run(cfg, out, progress=False)
    records = caplog.text
    # Not vacuous: the run signed its requests with the key id, and the logs masked it.
    assert "Credential=***" in records
    assert result.exit_code == 0
    captured = capfd.readouterr()

    secrets = [s3.ENV["AWS_SECRET_ACCESS_KEY"], s3.ENV["AWS_ACCESS_KEY_ID"]]
    texts = {f"{out}/{rel}": data for rel, data in s3.objects(out).items()}
    assert "manifest.json" in "".join(texts) and any("logs/run.log" in k for k in texts)
    texts["stdout"], texts["stderr"] = captured.out.encode(), captured.err.encode()
    texts["log records"] = records.encode()
    # Ray's record of the job (its config: metadata, runtime env) and its log files.
    accessor = state._connect_and_get_accessor()  # Ray's own reader of the GCS job table
    jobs = accessor.get_job_table(skip_submission_job_info_field=False)
    texts["ray jobs"] = "".join(str(gcs_pb2.JobTableData.FromString(j)) for j in jobs).encode()
    assert texts["ray jobs"], "no Ray job record to scan"
    hits = [
        f"{at}: {s[:6]}..." for at, data in texts.items() for s in secrets if s.encode() in data
    ]
    ray_hits, scanned = _scan_ray_logs(secrets)
    assert scanned > 0
    assert not hits + ray_hits, "\n".join(hits + ray_hits)


def _scan_ray_logs(secrets: list[str]) -> tuple[list[str], int]:
    """The Ray session's log files (workers, raylet, GCS) searched for each credential."""
    files = ray_log_files()
    hits: list[str] = []
    for path in files:
        data = path.read_bytes()
        hits += [f"{path}: {s[:6]}..." for s in secrets if s.encode() in data]
    return hits, len(files)
