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

from factory.bench.nodes import cache_entries
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
    typed = [".venv/bin/python", "-m", "factory.run"]
    assert resume_command(["x.yaml", "--fresh"], typed) == ".venv/bin/python -m factory.run x.yaml"


def test_the_resume_hint_starts_as_the_user_typed_the_command() -> None:
    """Issue 39: a user of ``.venv/bin/python`` was told ``python -m factory.run ...``,
    another interpreter in a fresh shell. The interpreter's path is kept as typed; the
    console script is ``factory run`` when that is what PATH finds, else its path."""
    from factory.engine.interrupts import invocation

    module = "python -m factory.run"
    venv = [".venv/bin/python", "-m", "factory.run", "airline.yaml", "-o", "out"]
    assert invocation(module, venv, "/x/factory/run.py") == venv[:3]
    options = ["/usr/bin/python3.11", "-u", "-m", "factory.run", "a.yaml"]
    assert invocation(module, options, "/x/factory/run.py") == options[:4]
    # `python -m factory run ...` (factory/__main__.py dispatches to `factory run`)
    dispatched = ["py", "-m", "factory", "run", "a.yaml"]
    assert invocation("factory run", dispatched, "/x/factory/__main__.py") == dispatched[:4]
    script = ["/v/bin/python3", "/v/bin/factory", "run", "a.yaml"]
    on_path = {"factory": "/v/bin/factory"}.get
    assert invocation("factory run", script, "/v/bin/factory", on_path) == ["factory", "run"]
    typed = ["/v/bin/python3", ".venv/bin/factory", "run", "a.yaml"]
    elsewhere = {"factory": "/usr/local/bin/factory"}.get
    assert invocation("factory run", typed, ".venv/bin/factory", elsewhere) == [
        ".venv/bin/factory",
        "run",
    ]
    # main() called by another program (a test): its own name for itself
    pytest_argv = ["/v/bin/python", "-m", "pytest", "tests"]
    assert invocation(module, pytest_argv, "/v/bin/pytest") == ["python", "-m", "factory.run"]


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


def _requests(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.ray
@pytest.mark.timeout(1800)  # three runs, two Ray start-ups: generous on a busy machine
@pytest.mark.parametrize(
    ("sig", "whole_group", "twice"),
    [(signal.SIGINT, True, False), (signal.SIGTERM, False, True)],
    ids=["ctrl-c", "sigterm-twice"],
)
def test_an_interrupted_run_says_how_to_resume_and_resumes(
    ray_session, devserver, tmp_path, sig: signal.Signals, whole_group: bool, twice: bool
) -> None:
    """Ctrl-C reaches the terminal's whole foreground group (the driver and the Ray it
    started); SIGTERM (kill, systemd, docker stop) the driver alone. Either way: exit
    130, one line saying how to resume (the command as typed, the interpreter's path
    included), no traceback; the same command then finishes with the dataset an
    uninterrupted run writes.

    One signal: the requests in flight finish within ``llm.stop_grace_s`` and are
    stored; none is cancelled (on main 046b88e the server logged 499 for 16 of them and
    the resume sent them again). A second signal during that wait ends the run at once
    and still says how to resume (on 046b88e: exit 130 and nothing printed)."""
    from factory.engine.runner import run

    log = tmp_path / "requests.jsonl"
    server = devserver(seed=21, latency_ms=1000, request_log=str(log))
    out_ref = tmp_path / "ref"
    run(
        recipe("airline.yaml", out_ref, *dev_overrides(server.url, target=80)),
        out_ref,
        progress=False,
    )
    before = len(_requests(log))  # the reference run's requests

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
        while cache_entries(out) < 50:  # judge done, amplification under way
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.time() < deadline, "the run made no progress"
            time.sleep(0.05)
        stored_before = cache_entries(out)
        if whole_group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        seen = []
        if twice:  # once the first is handled (the grace has begun), a second one
            assert proc.stderr is not None
            for line in proc.stderr:
                seen.append(line)
                if line.startswith("stopping:"):
                    break
            os.kill(proc.pid, sig)
        _, rest = proc.communicate(timeout=120)  # a generous deadline, not a measure
        stderr = "".join(seen) + rest
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and "core dumped" not in stderr.lower(), stderr[-3000:]
    assert len([line for line in stderr.splitlines() if line.startswith("stopping:")]) == 1
    first = "interrupted again" if twice else f"interrupted by {signal.Signals(sig).name}"
    lines = [line for line in stderr.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1 and lines[0].startswith(first), stderr[-3000:]
    assert lines[0].endswith(resume_command(args[3:], args[:3])), lines[0]
    assert json.loads((out / "run.json").read_text())["status"] == "running"
    assert cache_entries(out) >= stored_before
    if not twice:  # every request sent was answered and stored: nothing to pay again
        sent = _requests(log)[before:]
        assert sent and all(r["completed"] for r in sent), [r for r in sent if not r["completed"]]
        assert cache_entries(out) == len(sent)

    if twice:
        done = subprocess.run(
            args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-2000:]
    else:  # issue 39: a Ctrl-C once the data is complete does not make the run interrupted
        done = _interrupt_once_done(args, out)
        assert done.returncode == 0, done.stderr[-2000:]
        said = done.stdout + done.stderr  # the summary, or the line after it
        assert "interrupted by" not in said, said[-3000:]
        # Where the signal landed: in the report or Ray's shutdown (the summary says so),
        # in the summary's print (the line after it), or, on a machine loaded enough to
        # delay this test's Ctrl-C that long, after the summary with its report was out.
        cut = f"SIGINT after the run was complete: {out} holds the finished" in said
        assert cut or "\nreport: " in done.stdout, said[-3000:]
    assert json.loads((out / "run.json").read_text())["status"] == "done"
    assert _ids(out) == _ids(out_ref)
    assert json.loads((out / "manifest.json").read_text())["responses_from_cache"] > 0
    paid = [r["request_id"] for r in _requests(log)[before:] if r["completed"]]
    if not twice:
        assert len(paid) == len(set(paid)), "an answered request was paid again"
        return
    # The same command on the finished folder: it runs nothing, and says so with the
    # wall time of this process (on 046b88e: "wall time: 0.0s (since process start)").
    again = subprocess.run(args, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already complete: nothing was run; the run that wrote it took" in again.stdout
    wall = [line for line in again.stdout.splitlines() if line.startswith("wall time: ")]
    assert len(wall) == 1 and float(wall[0].split()[2].rstrip("s")) > 0.0, again.stdout


def _interrupt_once_done(args: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    """Run ``args`` and press Ctrl-C (the whole group) the moment run.json says done:
    the report and Ray's shutdown (about 2 s) are still to come."""
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
        state = out / "run.json"
        while json.loads(state.read_text())["status"] != "done":
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.time() < deadline, "the resume did not finish"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)


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
