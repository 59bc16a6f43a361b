"""The run's own LLM pool (``llm.serve``, factory.engine.serve): command lines, the guard
that ties an engine to its actor, and the whole lifecycle on a real Ray cluster with the
development server as the engine and a custom resource standing in for GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from factory.bench.nodes import cache_entries
from factory.engine.serve import (
    advertised_host,
    describe_exit,
    engine_command,
    replica_action,
    replica_ports,
    serving,
)
from factory.errors import ConfigError
from factory.recipe import ServeConfig, load_recipe
from tests.conftest import ROOT
from tests.helpers import free_port, free_port_range, listening, read_rows, stop_head

# --- pure parts ---------------------------------------------------------------------------


def test_replica_i_listens_on_the_first_port_plus_i() -> None:
    assert replica_ports((8000, 8099), 3) == [8000, 8001, 8002]
    with pytest.raises(ConfigError, match="3 replicas need 3 ports") as err:
        replica_ports((8000, 8001), 3)
    assert err.value.key_path == "llm.serve.port_range"
    with pytest.raises(ConfigError, match="first <= last"):
        replica_ports((9000, 8000), 1)


def test_the_default_engine_is_vllm_serve_with_tensor_parallelism() -> None:
    serve = ServeConfig(gpus_per_replica=4, engine_args=["--enable-prefix-caching"])  # type: ignore[call-arg]
    cmd = engine_command(serve, model="Qwen/Qwen3-32B", port=8003, python="/py")
    assert cmd == [
        "vllm",
        "serve",
        "Qwen/Qwen3-32B",
        "--host",
        "0.0.0.0",
        "--port",
        "8003",
        "--tensor-parallel-size",
        "4",
        "--enable-prefix-caching",
    ]
    dev = ServeConfig(command=["{python}", "-m", "factory.devserver", "--port", "{port}"])  # type: ignore[call-arg]
    assert engine_command(dev, model="m", port=9, python="/py") == [
        "/py",
        "-m",
        "factory.devserver",
        "--port",
        "9",
    ]
    with pytest.raises(ConfigError, match="unknown placeholder") as err:
        engine_command(ServeConfig(command=["x", "{gpu}"]), model="m", port=1, python="p")  # type: ignore[call-arg]
    assert err.value.key_path == "llm.serve.command"


def test_an_engine_killed_by_a_signal_is_named_so() -> None:
    assert describe_exit(137) == "engine killed by SIGKILL"
    assert describe_exit(1) == "engine exited with code 1"


@pytest.mark.parametrize(
    ("state", "status", "elapsed", "expected"),
    [
        ("healthy", None, 0.0, ("replace_actor", "actor lost")),
        ("down", {"healthy": True, "running": True}, 9.0, ("healthy", "")),
        (
            "healthy",
            {"healthy": False, "running": False, "returncode": 137},
            0.0,
            ("restart", "engine killed by SIGKILL"),
        ),
        ("healthy", {"healthy": False, "running": True}, 0.0, ("down", "")),
        ("down", {"healthy": False, "running": True}, 10.0, ("keep", "")),
        ("down", {"healthy": False, "running": True}, 121.0, ("restart", "unhealthy for 120s")),
        ("starting", {"healthy": False, "running": True}, 299.0, ("keep", "")),
        (
            "starting",
            {"healthy": False, "running": True},
            301.0,
            ("restart", "not healthy within 300s (startup_timeout_s)"),
        ),
    ],
)
def test_the_monitor_restarts_what_died_or_stays_unhealthy(
    state: str, status: dict | None, elapsed: float, expected: tuple[str, str]
) -> None:
    assert replica_action(state, status, elapsed, 300.0) == expected


def test_the_advertised_host_is_the_nodes_unless_the_engine_listens_on_loopback() -> None:
    assert advertised_host("0.0.0.0", "10.0.0.7") == "10.0.0.7"
    assert advertised_host("127.0.0.1", "10.0.0.7") == "127.0.0.1"
    assert advertised_host("10.0.0.9", "10.0.0.7") == "10.0.0.9"


def test_serve_and_explicit_endpoints_are_refused_before_anything_starts() -> None:
    cfg = load_recipe(
        ROOT / "pipelines" / "airline-vllm.yaml",
        ['llm.endpoints=[{"base_url": "http://127.0.0.1:1/v1"}]'],
    )
    with pytest.raises(ConfigError, match=r"replaces llm\.endpoints") as err, serving(cfg):
        pass
    assert err.value.key_path == "llm.serve"


def test_a_judge_model_the_pool_does_not_serve_is_refused() -> None:
    cfg = load_recipe(ROOT / "pipelines" / "airline-vllm.yaml", ["prefilter.model=o4-mini"])
    with pytest.raises(ConfigError, match="not served") as err, serving(cfg):
        pass
    assert err.value.key_path == "prefilter.model"


def test_the_vllm_recipe_serves_its_model_on_gpus() -> None:
    cfg = load_recipe(ROOT / "pipelines" / "airline-vllm.yaml")
    assert cfg.llm is not None and cfg.llm.serve is not None
    assert cfg.llm.serve.resource == "GPU" and cfg.llm.serve.command[:2] == ["vllm", "serve"]
    assert "endpoints" not in cfg.llm.model_fields_set


# --- the guard: an engine never outlives its actor -------------------------------------------


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _poll(condition, what: str, deadline_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_guard_ends_the_engine_and_its_children_when_its_actor_is_killed(
    tmp_path: Path,
) -> None:
    """The "actor" (a plain process here) starts the guard as ReplicaActor does and is
    SIGKILLed: the engine and the process it started must end (its whole group)."""
    pids = tmp_path / "pids"
    engine = (
        "import os, subprocess, time; child = subprocess.Popen(['sleep', '600']); "
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}'); time.sleep(600)"
    )
    actor = (
        "import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-m', "
        "'factory.engine.serveguard', '--parent', str(os.getpid()), '--', sys.executable, "
        f"'-c', {engine!r}], start_new_session=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", actor], cwd=ROOT)
    try:
        _poll(lambda: pids.is_file() and len(pids.read_text().split()) == 2, "the engine")
        engine_pid, child_pid = (int(x) for x in pids.read_text().split())
        assert not _gone(engine_pid) and not _gone(child_pid)
        proc.kill()
        proc.wait()
        _poll(lambda: _gone(engine_pid) and _gone(child_pid), "the engine's group to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_guard_passes_on_how_the_engine_ended() -> None:
    guard = [sys.executable, "-m", "factory.engine.serveguard", "--parent", str(os.getpid())]
    suicide = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    killed = subprocess.run([*guard, "--", sys.executable, "-c", suicide], cwd=ROOT, timeout=100)
    assert killed.returncode == 128 + signal.SIGKILL
    failed = subprocess.run(
        [*guard, "--", sys.executable, "-c", "raise SystemExit(3)"], timeout=100
    )
    assert failed.returncode == 3


# --- the lifecycle on a Ray cluster --------------------------------------------------------


def _start_head(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.Popen[bytes], dict[str, str], int, Path]:
    """``ray start --head`` on fresh free ports: (process, driver env, GCS port, log)."""
    tmp_ray = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    home = tmp_path_factory.mktemp("home")
    gcs = free_port()
    workers = free_port_range(40)
    ports = {
        "--port": gcs,
        "--dashboard-agent-listen-port": free_port(),
        "--dashboard-agent-grpc-port": free_port(),
        "--metrics-export-port": free_port(),
        "--runtime-env-agent-port": free_port(),
        "--ray-client-server-port": free_port(),
        "--node-manager-port": free_port(),
        "--object-manager-port": free_port(),
        "--min-worker-port": workers,
        "--max-worker-port": workers + 39,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST_"))}
    env.update(
        HOME=str(home),
        RAY_TMPDIR=tmp_ray,
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_agent_register_timeout_ms="300000",
    )
    args = ["start", "--head", "--block", "--node-ip-address", "127.0.0.1"]
    args += [x for k, v in ports.items() for x in (k, str(v))]
    args += ["--num-cpus", "2", "--resources", '{"fake_gpu": 2}', "--include-dashboard=false"]
    args += ["--disable-usage-stats"]
    log = tmp_path_factory.mktemp("head") / "head.log"
    ray_bin = str(Path(sys.executable).parent / "ray")
    with log.open("w") as log_file:
        head = subprocess.Popen(
            [ray_bin, *args],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return head, {**env, "RAY_ADDRESS": f"127.0.0.1:{gcs}"}, gcs, log


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A Ray head of its own (``ray start``, authentication off) with 2 CPUs and 2
    ``fake_gpu``: the cluster ``ray job submit`` would run the driver on. Yields the
    environment a driver joins it with.

    Ray gives a starting raylet a fixed 30 s to register with the GCS, which a busy
    2-core machine can exceed ("The current node timed out during startup", seen once
    in 6 hog-loop runs): such a start is ended and made again on fresh ports.
    """
    for attempt in range(1, 4):
        head, driver_env, gcs, log = _start_head(tmp_path_factory)
        # A driver that dials the GCS before it listens can hang far past its own retries
        # (seen twice on a loaded machine: 300 s of "Failed to connect to GCS"), so wait
        # for the port first, and give each probe less than the whole deadline.
        _poll(lambda h=head, p=gcs: h.poll() is not None or listening(p), "the GCS port", 300)
        _poll(
            lambda h=head, e=driver_env: h.poll() is not None or _fake_gpus_free(e) == 2.0,
            "the Ray head",
            deadline_s=300,
        )
        if head.poll() is None:
            break
        text = log.read_text()
        stop_head(head)
        if attempt == 3 or "timed out during startup" not in text:
            raise AssertionError(text[-3000:])
    try:
        yield driver_env
    finally:
        stop_head(head)


def _fake_gpus_free(env: dict[str, str], timeout_s: float = 120.0) -> float | None:
    """The cluster's unreserved ``fake_gpu`` (a placement group holds them while it lives);
    None when the probe failed or hung (the caller polls again)."""
    code = (
        "import ray; ray.init(log_to_driver=False); "
        "print(ray.available_resources().get('fake_gpu', 0.0))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True,
            timeout=timeout_s,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return None
    return float(done.stdout.strip().splitlines()[-1])


def _engines(first_port: int, *, guards: bool = False) -> dict[int, int]:
    """pid of the development server (or of its guard) on each of our ports, by port."""
    found: dict[int, int] = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        guard = "factory.engine.serveguard" in cmd
        if "factory.devserver" in cmd and "--port" in cmd and guard == guards:
            port = int(cmd[cmd.index("--port") + 1])
            if first_port <= port < first_port + 2 and not _gone(p.info["pid"]):
                found[port] = p.info["pid"]
    return found


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _driver(out: Path, first_port: int, env: dict[str, str], target: int) -> subprocess.Popen:  # type: ignore[type-arg]
    """``python -m factory.run airline-vllm.yaml`` as ``ray job submit`` runs it, with the
    development server as the engine and ``fake_gpu`` as the GPUs."""
    command = ["{python}", "-m", "factory.devserver", "--port", "{port}", "--latency-ms", "500"]
    sets = [
        "llm.model=factory-dev",
        f"amplify.target={target}",
        "llm.serve.replicas=2",
        "llm.serve.gpus_per_replica=1",
        "llm.serve.resource=fake_gpu",
        "llm.serve.cpus_per_replica=0",
        "llm.serve.host=127.0.0.1",
        f"llm.serve.port_range=[{first_port}, {first_port + 1}]",
        "llm.serve.command=" + json.dumps(command),
        "llm.serve.engine_args=[]",
        "llm.serve.startup_timeout_s=300",
        "llm.concurrency=4",
        "llm.per_actor_concurrency=2",
        "llm.timeout_s=30",
        "llm.retry.base_delay_s=0.05",
        "llm.retry.max_delay_s=0.5",
        "ray.actors=2",
        "ray.num_cpus=0.25",
    ]
    args = [sys.executable, "-m", "factory.run", "airline-vllm.yaml", "-o", str(out)]
    args += ["--no-progress", *[x for s in sets for x in ("--set", s)]]
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _end(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


@pytest.mark.ray
@pytest.mark.timeout(1200)
def test_a_run_reaches_its_target_through_its_pool_and_outlives_a_replica(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """Two replicas start, serve the run, one is SIGKILLed mid-run: the run finishes on
    the other, the killed one comes back on its URL, and after the run nothing is left
    (no engine, no reserved fake GPU)."""
    first = free_port_range(2)
    out = tmp_path / "out"
    proc = _driver(out, first, cluster, target=100)
    try:
        _poll(lambda: proc.poll() is not None or cache_entries(out) >= 10, "calls")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        engines = _engines(first)
        assert sorted(engines) == [first, first + 1], engines
        os.kill(engines[first], signal.SIGKILL)
        killed_at = time.monotonic()
        _poll(
            lambda: (
                proc.poll() is not None
                or (_engines(first).get(first) not in (None, engines[first]) and _healthy(first))
            ),
            "the killed replica to come back",
        )
        assert proc.poll() is None, "the run ended before the killed replica came back"
        print(f"replica back after {time.monotonic() - killed_at:.1f}s")  # a measure, no assert
        _, stderr = proc.communicate(timeout=900)
    finally:
        _end(proc)
    assert proc.returncode == 0, stderr[-3000:]
    assert "replica 0 engine killed by SIGKILL; restarting it" in stderr, stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["reached"] is True
    assert len(read_rows(out)) == 100
    replicas = manifest["serve"]["replicas"]
    assert [r["url"] for r in replicas] == [
        f"http://127.0.0.1:{first}/v1",
        f"http://127.0.0.1:{first + 1}/v1",
    ]
    assert [r["restarts"] for r in replicas] == [1, 0]
    assert replicas[0]["deaths"] == ["engine killed by SIGKILL"]
    _poll(lambda: not _engines(first), "every engine to be stopped")
    _poll(lambda: not _engines(first, guards=True), "every guard to exit")
    _poll(lambda: _fake_gpus_free(cluster) == 2.0, "the placement groups to be removed")


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_a_sigkilled_driver_leaves_no_replica_behind(
    cluster: dict[str, str], tmp_path: Path
) -> None:
    """``kill -9`` of the driver (the OOM killer, a lost submitter): the cluster lives on,
    and Ray's owner clean-up, the actors' driver watch and the guard must still end every
    engine and free its resources."""
    first = free_port_range(2)
    out = tmp_path / "out"
    proc = _driver(out, first, cluster, target=400)
    try:
        _poll(lambda: proc.poll() is not None or cache_entries(out) >= 5, "the run's calls")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        engines = _engines(first)
        assert len(engines) == 2, engines
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.communicate()
    finally:
        _end(proc)
    _poll(lambda: all(_gone(pid) for pid in engines.values()), "the engines to end")
    print(f"engines gone {time.monotonic() - killed_at:.1f}s after the driver's kill")
    assert not _engines(first)
    _poll(lambda: not _engines(first, guards=True), "every guard to exit")
    _poll(lambda: _fake_gpus_free(cluster) == 2.0, "the placement groups to be removed")


def test_the_rayjob_manifest_runs_the_vllm_recipe_on_enough_gpus() -> None:
    """cluster/rayjob-vllm.yaml submits a shipped recipe, and its GPU worker group holds
    every replica: a replica's GPUs on one pod (STRICT_PACK), all replicas at once."""
    import shlex

    import yaml

    from factory.recipe import resolve_recipe_path

    doc = yaml.safe_load((ROOT / "cluster" / "rayjob-vllm.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayJob")
    spec = doc["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    args = shlex.split(spec["entrypoint"])
    assert args[:3] == ["python", "-m", "factory.run"]
    cfg = load_recipe(resolve_recipe_path(args[3], ROOT))
    assert cfg.llm is not None and cfg.llm.serve is not None
    serve = cfg.llm.serve
    groups = spec["rayClusterSpec"]["workerGroupSpecs"]
    fits = 0
    for group in groups:
        (container,) = group["template"]["spec"]["containers"]
        limits = container["resources"]["limits"]
        gpus = int(limits.get("nvidia.com/gpu", 0))
        per_pod = gpus // serve.gpus_per_replica
        assert per_pod * serve.cpus_per_replica <= float(limits["cpu"])
        fits += per_pod * group["maxReplicas"]
    assert fits >= serve.replicas


def test_the_multi_node_rayjob_runs_a_shipped_recipe_with_its_output_on_object_storage() -> None:
    """cluster/rayjob-airline.yaml: its entrypoint loads as a recipe with its overrides, the
    output is an s3:// prefix, the head takes no worker (num-cpus 0: a lost head loses no
    worker) and the worker group holds every worker of the run at once."""
    import shlex

    import yaml

    from factory.io.objectstore import output_location
    from factory.recipe import resolve_recipe_path

    doc = yaml.safe_load((ROOT / "cluster" / "rayjob-airline.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayJob")
    spec = doc["spec"]
    args = shlex.split(spec["entrypoint"])
    assert args[:3] == ["python", "-m", "factory.run"]
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    cfg = load_recipe(resolve_recipe_path(args[3], ROOT), sets)
    output = args[args.index("--output") + 1]
    assert isinstance(output_location(output), str) and output.startswith("s3://")
    assert "env_vars" in spec["runtimeEnvYAML"] and "KEY" not in spec["runtimeEnvYAML"]
    cluster = spec["rayClusterSpec"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    (group,) = cluster["workerGroupSpecs"]
    (container,) = group["template"]["spec"]["containers"]
    cpus = float(container["resources"]["limits"]["cpu"])
    assert group["maxReplicas"] * cpus >= cfg.ray.actors * cfg.ray.num_cpus
    assert cfg.ray.placement == "spread"
