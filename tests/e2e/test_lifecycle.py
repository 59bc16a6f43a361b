"""A run's life from outside: interrupts, which Ray it joins, how its workers end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from factory.engine.interrupts import resume_command
from factory.engine.raycompat import ray_address
from factory.engine.watchdog import DriverWatch, loss_reason
from tests.conftest import ROOT
from tests.helpers import dev_overrides, free_port, listening, read_rows, recipe, stop_head


def _env(**extra: str) -> dict[str, str]:
    """The environment of a CLI run: a private Ray (own RAY_TMPDIR), not pytest's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "RAY_ADDRESS")}
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rl", dir="/tmp")
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.update(extra)
    return env


def _cache_entries(out: Path) -> int:
    folder = out / "cache"
    if not folder.is_dir():
        return 0
    return sum(len(p.read_bytes().splitlines()) for p in folder.glob("*.jsonl"))


def _ids(out: Path) -> set[str]:
    rows = read_rows(out)
    assert len(rows) == len({r["id"] for r in rows}), "duplicate rows in data/"
    return {r["id"] for r in rows}


# --- pure parts -----------------------------------------------------------------------


def test_loss_reason_names_what_is_gone() -> None:
    watch = DriverWatch(parent_pid=10, driver_pid=20, driver_create_time=5.0)
    alive = {"parent_pid": 10, "driver_create_time": 5.0, "job_dead": False}
    assert loss_reason(watch, **alive) is None
    assert "raylet" in str(loss_reason(watch, **{**alive, "parent_pid": 1}))
    assert "driver" in str(loss_reason(watch, **{**alive, "driver_create_time": None}))
    assert "driver" in str(loss_reason(watch, **{**alive, "driver_create_time": 6.0}))  # reused
    assert "GCS" in str(loss_reason(watch, **{**alive, "job_dead": True}))
    remote = DriverWatch(parent_pid=10, driver_pid=None, driver_create_time=None)
    assert loss_reason(remote, parent_pid=10, driver_create_time=None, job_dead=False) is None


def test_resume_command_repeats_the_arguments_but_never_fresh() -> None:
    cmd = resume_command(["airline.yaml", "--fresh", "--set", "amplify.target=5", "-o", "a b"])
    assert cmd == "python -m factory.run airline.yaml --set amplify.target=5 -o 'a b'"


def test_ray_address_is_local_unless_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address() == "local"
    assert ray_address("ray://head:10001") == "ray://head:10001"
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    assert ray_address("ray://head:10001") == "http://127.0.0.1:8265"


def test_ray_address_may_change_between_runs_of_one_folder() -> None:
    from factory.io.runstate import changed_keys

    a = recipe("airline.yaml", Path("/tmp/x")).model_dump(mode="json")
    b = recipe("airline.yaml", Path("/tmp/x"), "ray.address=auto").model_dump(mode="json")
    assert a["ray"]["address"] is None and b["ray"]["address"] == "auto"
    assert changed_keys(a, b) == []


# --- Ray: which cluster a run joins ---------------------------------------------------


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_stale_cluster_file_is_ignored_and_the_run_starts_its_own_ray(tmp_path) -> None:
    """Ray 2.60 reads ``$RAY_TMPDIR/ray/ray_current_cluster`` (ray._common.utils.
    get_ray_address_file) when ray.init() gets no address; here it names a head that
    is gone. The run must start its own local Ray and finish."""
    env = _env()
    stale = Path(env["RAY_TMPDIR"]) / "ray" / "ray_current_cluster"
    stale.parent.mkdir(parents=True)
    stale.write_text(f"127.0.0.1:{free_port()}")  # nothing listens there
    out = tmp_path / "out"
    args = [sys.executable, "-m", "factory.run", "airline-seeds.yaml", "-o", str(out)]
    args.append("--no-progress")
    try:
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung on the cluster a stale ray_current_cluster file names")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((out / "run.json").read_text())["status"] == "done"
    assert read_rows(out), "no rows written"


# --- interrupts ------------------------------------------------------------------------


@pytest.mark.ray
@pytest.mark.timeout(1800)  # three runs, two Ray start-ups: generous on a busy machine
@pytest.mark.parametrize(
    ("sig", "whole_group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["ctrl-c", "sigterm"],
)
def test_an_interrupted_run_says_how_to_resume_and_resumes(
    ray_session, devserver, tmp_path, sig: signal.Signals, whole_group: bool
) -> None:
    """Ctrl-C reaches the terminal's whole foreground group (the driver and the Ray it
    started); SIGTERM (kill, systemd, docker stop) the driver alone. Either way: exit
    130, one line saying how to resume, no traceback; the same command then finishes
    with the dataset an uninterrupted run writes."""
    from factory.engine.runner import run

    server = devserver(seed=21, latency_ms=40)
    out_ref = tmp_path / "ref"
    run(
        recipe("airline.yaml", out_ref, *dev_overrides(server.url, target=80)),
        out_ref,
        progress=False,
    )

    out = tmp_path / "out"
    args = [sys.executable, "-m", "factory.run", "airline.yaml", "-o", str(out), "--no-progress"]
    args += [x for o in dev_overrides(server.url, target=80) for x in ("--set", o)]
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while _cache_entries(out) < 50:  # judge done, amplification under way
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.time() < deadline, "the run made no progress"
            time.sleep(0.05)
        stored_before = _cache_entries(out)
        if whole_group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        _, stderr = proc.communicate(timeout=120)  # a generous deadline, not a measure
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "core dumped" not in stderr.lower(), stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("interrupted by")]
    assert len(lines) == 1, stderr[-3000:]
    assert signal.Signals(sig).name in lines[0]
    assert lines[0].endswith(resume_command(args[3:])), lines[0]
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    assert _cache_entries(out) >= stored_before

    done = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _ids(out) == _ids(out_ref)
    assert json.loads((out / "manifest.json").read_text())["responses_from_cache"] > 0


# --- docs/cluster.md's quick-start, for real ----------------------------------------------


# What the dashboard answers a job submitted before its agent registered (Ray 2.60).
NO_AGENT = "No available agent to submit job"


def _quick_start_blocks() -> tuple[str, str, str]:
    """The three shell blocks of docs/cluster.md's "Local quick-start on a Ray cluster"."""
    text = (ROOT / "docs" / "cluster.md").read_text(encoding="utf-8")
    section = text.split("## Local quick-start on a Ray cluster", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```bash\n")[1:]]
    assert len(blocks) == 3, "the quick-start has a head block, a node block and a submit block"
    return blocks[0], blocks[1], blocks[2]


def _http_ok(url: str, token: str) -> bool:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.ray
@pytest.mark.timeout(1800)
def test_the_documented_cluster_quick_start_works_as_written(tmp_path) -> None:
    """Starts a real two-node Ray cluster on 127.0.0.1 (token authentication on) with
    docs/cluster.md's commands, only the ports swapped for free ones and the folders for
    temporary ones, submits its `ray job submit` and checks the job's exit and output, and
    that the second node ran a worker of the run (``ray.placement: spread``)."""
    import re

    head, node, submit = _quick_start_blocks()
    fixed = re.findall(r"--[a-z-]*port (\d+)", head + node)
    ports: dict[str, str] = {}
    taken: set[int] = set()
    for block in (head, node):  # each node's worker ports: a range of the documented width
        lowest, highest = (int(p) for p in re.findall(r"--m(?:in|ax)-worker-port (\d+)", block))
        base = free_port()
        while any(p in taken for p in range(base, base + highest - lowest + 1)):
            base = free_port()
        ports.update({str(lowest): str(base), str(highest): str(base + highest - lowest)})
        taken |= set(range(base, base + highest - lowest + 1))
    workers = taken
    for p in fixed:
        if p in ports:
            continue
        # Every other port outside the worker range and unique: Ray refuses a port two
        # components would share (a CI run drew the node manager's port inside the
        # worker range, 2026-11-22).
        port = free_port()
        while port in workers or str(port) in ports.values():
            port = free_port()
        ports[p] = str(port)
    tmp_ray = tempfile.mkdtemp(prefix="rq", dir="/tmp")  # short: Ray's socket paths
    out = tmp_path / "out"

    def adapt(block: str) -> str:
        for old, new in ports.items():
            block = re.sub(rf"\b{old}\b", new, block)
        block = block.replace("/tmp/factory-ray", tmp_ray)
        block = block.replace("$PWD/out/airline-cluster", str(out))
        venv = Path(sys.executable).parent
        return block.replace("source .venv/bin/activate", f"source {venv}/activate")

    home = tmp_path / "home"  # the token goes to $HOME/.ray/auth_token: keep it private
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST_"))}
    env.update(
        HOME=str(home),
        RAY_USAGE_STATS_ENABLED="0",
        # Not part of the commands: room for a busy CI machine (the raylet otherwise
        # aborts when the dashboard agent needs more than 30 s to start) and a free port
        # for the dashboard's own metrics server (44227 is taken by any other head).
        RAY_agent_register_timeout_ms="300000",
        DASHBOARD_METRIC_PORT=str(free_port()),
    )
    dashboard = ports[re.search(r"--dashboard-port (\d+)", head).group(1)]  # type: ignore[union-attr]
    agent = ports[re.search(r"--dashboard-agent-listen-port (\d+)", head).group(1)]  # type: ignore[union-attr]
    token_file = home / ".ray" / "auth_token"
    head_proc = node_proc = None
    try:
        for attempt in range(3):  # Ray gives its raylet a fixed 30 s to start: retry on a busy box
            # The head's messages go to a file, not a pipe: a blocked pipe would stall the
            # head, and an open one outlives the test as a ResourceWarning.
            head_log = tmp_path / f"head-{attempt}.log"
            with head_log.open("w") as log_file:
                head_proc = subprocess.Popen(
                    ["bash", "-ec", adapt(head)],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=log_file,
                    start_new_session=True,
                )
            deadline = time.time() + 300
            # Up = the dashboard answers and the head's dashboard agent (which runs the
            # job) listens: the dashboard waits only 10 s for that agent when a job is
            # submitted, and a loaded machine started it later ("No available agent to
            # submit job", hog loop, 2026-11-23).
            while head_proc.poll() is None and not (
                token_file.is_file()
                and _http_ok(f"http://127.0.0.1:{dashboard}/api/jobs/", token_file.read_text())
                and listening(int(agent))
            ):
                assert time.time() < deadline, "the head did not come up"
                time.sleep(0.5)
            if head_proc.poll() is None:
                break
            head_proc.wait()
            failure = head_log.read_text()
            assert attempt < 2 and "timed out during startup" in failure, failure[-3000:]
        node_log = tmp_path / "node.log"
        with node_log.open("w") as log_file:
            node_proc = subprocess.Popen(
                ["bash", "-ec", adapt(node)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                start_new_session=True,
            )
        node_manager = ports[re.search(r"--node-manager-port (\d+)", node).group(1)]  # type: ignore[union-attr]
        deadline = time.time() + 300
        while not listening(int(node_manager)):  # the second raylet is up
            assert node_proc.poll() is None, node_log.read_text()[-3000:]
            assert time.time() < deadline, "the second node did not come up"
            time.sleep(0.5)
        for _ in range(3):
            job = subprocess.run(
                ["bash", "-ec", adapt(submit)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            # Refused before a job existed, with Ray's "please try again later" (what the
            # docs tell a person to do): nothing ran, so submitting again is the same job.
            if NO_AGENT not in job.stdout + job.stderr:
                break
            time.sleep(5)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "succeeded" in job.stdout + job.stderr
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["generated_with_devserver"] is True
        assert manifest["target"]["reached"] is True
        assert len(read_rows(out)) == 50
        shards = sorted(p.relative_to(out).as_posix() for p in (out / "data").glob("*.parquet"))
        assert shards and sorted(f for f in manifest["files"] if f.startswith("data/")) == shards
        assert json.loads((out / "run.json").read_text())["status"] == "done"
        assert node_proc.poll() is None, node_log.read_text()[-3000:]
        # The second raylet (its log, raylet.1.out or so) started a worker for the job.
        logs = [f for f in Path(tmp_ray).rglob("raylet*.out") if f.name != "raylet.out"]
        assert any("Started worker process" in f.read_text(errors="replace") for f in logs), [
            str(f) for f in Path(tmp_ray).rglob("raylet*")
        ]
    finally:
        if node_proc is not None:
            stop_head(node_proc)
        if head_proc is not None:
            stop_head(head_proc)


def test_a_failed_ray_start_leaves_no_process_behind() -> None:
    """What a timed-out ``ray.init`` started is ended before the next attempt, without a
    ResourceWarning for the handles it leaves (pytest turns those into errors)."""
    import warnings

    import psutil

    from factory.engine.raycompat import _discard_failed_start

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        _discard_failed_start(before)
    assert child.returncode is not None  # reaped through its handle: no warning later
    assert child.pid not in {p.pid for p in psutil.Process().children(recursive=True)}
