"""The run's own LLM pool: one OpenAI-compatible engine per replica on the Ray cluster.

``llm.serve`` in a recipe makes the job start ``replicas`` engines (``vllm serve`` by
default, any command that serves ``/v1/chat/completions`` and ``/health``), send every
LLM call of the run to them, and stop them when the run ends, however it ends.

How the pieces hold together:

* **A placement group per replica** with one bundle ``{resource: gpus_per_replica, CPU:
  cpus_per_replica}``, ``STRICT_PACK``: the replica's GPUs on one node (vLLM's tensor
  parallelism runs its workers as processes of that node, ``mp`` backend). The bundle
  outlives the actor, so a replacement actor lands on the same node and listens on the
  same port: the URL every LLM actor was given stays valid, and the endpoint pool's
  circuit breaker (``factory.llm.pool``) takes the replica out while it is down and
  probes it back in. No endpoint list has to be redistributed.
* **A ``ReplicaActor``** per replica, scheduled into its bundle with the GPUs (with
  ``resource: GPU`` Ray sets ``CUDA_VISIBLE_DEVICES`` for it and the engine inherits it).
  It starts the engine under ``factory.engine.serveguard`` in a session of its own and
  answers ``status()`` by probing ``/health`` on its own node (the driver may not reach a
  worker's port).
* **Non-detached actors and placement groups**, owned by the driver: when the driver
  exits or is SIGKILLed (``ray job stop``, the OOM killer), Ray's GCS ends the job's
  actors and removes its placement groups; each actor also runs the driver watch
  (``factory.engine.watchdog``) and exits within about a second; the guard sees its
  actor gone and ends the engine's process group (vLLM's API server, engine core and
  GPU workers with it). A normal end (done, error, Ctrl-C) stops them from ``stop()``.
* **A monitor thread on the driver** polls every replica: an engine that exited (or
  stopped answering ``/health`` for ``DOWN_RESTART_S``) is started again by its actor,
  an actor that died is replaced in its bundle; each
  replica is replaced at most ``max_restarts`` times, then left down (the others go on).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ray

from factory.engine.console import console
from factory.errors import ConfigError, ServeError, short
from factory.recipe import EndpointConfig, Recipe, ServeConfig

__all__ = [
    "ReplicaActor",
    "ServePool",
    "advertised_host",
    "describe_exit",
    "engine_command",
    "replica_action",
    "replica_ports",
    "serving",
]

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often the driver looks at every replica
DOWN_RESTART_S = 120.0  # a replica that was healthy and stopped answering is restarted
STOP_GRACE_S = 30.0  # SIGTERM -> SIGKILL for an engine being stopped (vLLM frees its GPUs)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


# --- pure parts --------------------------------------------------------------------------


def replica_ports(port_range: tuple[int, int], replicas: int) -> list[int]:
    """Replica i listens on ``first + i``.

    Why fixed ports: a replacement must come back on the URL the LLM actors know.

    Raises:
        ConfigError: the range is reversed, out of 1..65535, or holds fewer ports than
            replicas.
    """
    first, last = port_range
    if not 1 <= first <= last <= 65535:
        raise ConfigError(
            f"expected [first, last] with 1 <= first <= last <= 65535, got {list(port_range)}",
            key_path="llm.serve.port_range",
        )
    if last - first + 1 < replicas:
        raise ConfigError(
            f"{replicas} replicas need {replicas} ports, the range {first}-{last} holds "
            f"{last - first + 1}",
            key_path="llm.serve.port_range",
        )
    return [first + i for i in range(replicas)]


def engine_command(serve: ServeConfig, *, model: str, port: int, python: str) -> list[str]:
    """The engine's argv: ``serve.command`` with its placeholders filled, then
    ``serve.engine_args``.

    Raises:
        ConfigError: a placeholder other than {model}, {host}, {port}, {gpus}, {python}.
    """
    values = {
        "model": model,
        "host": serve.host,
        "port": str(port),
        "gpus": str(serve.gpus_per_replica),
        "python": python,
    }
    out = []
    for part in serve.command:
        try:
            out.append(part.format(**values))
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"unknown placeholder in {short(part, 80)}; use {{model}}, {{host}}, "
                "{port}, {gpus} or {python}",
                key_path="llm.serve.command",
            ) from exc
    return out + list(serve.engine_args)


def advertised_host(bind_host: str, node_ip: str) -> str:
    """The host LLM actors use to reach a replica: the node's IP, or 127.0.0.1 for an
    engine that listens on loopback only (reachable from its own node alone)."""
    if bind_host in LOOPBACK:
        return "127.0.0.1"
    if bind_host in ("0.0.0.0", "::", ""):
        return node_ip
    return bind_host


def describe_exit(code: int | None) -> str:
    """An engine's end in words; the guard exits 128 + N for an engine signal N killed."""
    if code is not None and 128 < code < 128 + 65:
        with contextlib.suppress(ValueError):
            return f"engine killed by {signal.Signals(code - 128).name}"
    return f"engine exited with code {code}"


def replica_action(
    state: str, status: dict[str, Any] | None, elapsed_s: float, startup_timeout_s: float
) -> tuple[str, str]:
    """What the monitor does with a replica after one look: ``(action, reason)``.

    Args:
        state: the replica's state (``starting``, ``healthy``, ``down``).
        status: ``ReplicaActor.status()``; ``None`` when the actor could not answer.
        elapsed_s: seconds since ``state`` began.
        startup_timeout_s: ``llm.serve.startup_timeout_s``.

    Returns:
        ``replace_actor`` (the actor is gone), ``restart`` (its engine exited, or it
        stayed unhealthy: since it was healthy for ``DOWN_RESTART_S``, since a restart
        for ``startup_timeout_s``), ``healthy``, ``down`` (it stopped answering) or
        ``keep`` (wait).
    """
    if status is None:
        return "replace_actor", "actor lost"
    if status["healthy"]:
        return "healthy", ""
    if not status["running"]:
        return "restart", describe_exit(status["returncode"])
    if state == "healthy":
        return "down", ""
    if state == "down" and elapsed_s > DOWN_RESTART_S:
        # vLLM answers 503 once its engine core died; a hung server answers nothing
        return "restart", f"unhealthy for {DOWN_RESTART_S:g}s"
    if state == "starting" and elapsed_s > startup_timeout_s:
        return "restart", f"not healthy within {startup_timeout_s:g}s (startup_timeout_s)"
    return "keep", ""


def _probe_host(bind_host: str) -> str:
    return "127.0.0.1" if bind_host in (*LOOPBACK, "0.0.0.0", "::", "") else bind_host


# --- the actor that holds one replica's GPUs ------------------------------------------------


@ray.remote(max_concurrency=4)  # type: ignore[call-overload]  # status() answers during stop()
class ReplicaActor:
    """Runs one engine process (under ``serveguard``) and reports on it."""

    def __init__(self, command: list[str], port: int, bind_host: str) -> None:
        from factory.engine import watchdog

        watchdog.start()  # the driver gone: this process exits, the guard ends the engine
        self._command = [part.replace("{python}", sys.executable) for part in command]
        self._port = port
        self._health = f"http://{_probe_host(bind_host)}:{port}/health"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = ""
        self._lock = threading.Lock()

    def start(self) -> dict[str, Any]:
        """Start the engine (again, if it was stopped or exited)."""
        with self._lock:
            self._stop_locked(grace_s=15.0)  # longer than the guard's own grace
            fd, self._log_path = tempfile.mkstemp(prefix=f"factory-serve-{self._port}-")
            guard = [sys.executable, "-m", "factory.engine.serveguard"]
            guard += ["--parent", str(os.getpid())]
            with os.fdopen(fd, "wb") as logf:
                self._proc = subprocess.Popen(
                    [*guard, "--", *self._command],
                    stdout=logf,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # no signal aimed at the worker's group reaches it
                )
            return {"node_ip": ray.util.get_node_ip_address(), "log": self._log_path}

    def status(self) -> dict[str, Any]:
        """``running`` (the engine process lives), ``healthy`` (``/health`` answers 200),
        the exit code and the log's last lines once it exited."""
        proc = self._proc
        code = proc.poll() if proc is not None else None
        running = proc is not None and code is None
        healthy = False
        if running:
            try:
                with urllib.request.urlopen(self._health, timeout=2.0) as resp:
                    healthy = resp.status == 200
            except (urllib.error.URLError, OSError, ValueError):
                healthy = False
        return {
            "running": running,
            "healthy": healthy,
            "returncode": code,
            "tail": "" if running else _tail(self._log_path),
        }

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the guard (it ends the engine's group), SIGKILL after ``grace_s``."""
        with self._lock:
            self._stop_locked(grace_s)

    def _stop_locked(self, grace_s: float) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s + 5.0)  # the guard's own grace is inside this
        except subprocess.TimeoutExpired:  # the guard is stuck: end the engine's group too
            import psutil

            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(proc.pid).children():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(child.pid, signal.SIGKILL)  # the engine leads its group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _tail(path: str, lines: int = 12) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4000))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# --- the driver's side ----------------------------------------------------------------------


@dataclass
class _Replica:
    index: int
    port: int
    pg: Any
    actor: Any = None
    url: str = ""
    state: str = "starting"  # placing | starting | healthy | down | failed
    restarts: int = 0
    placing: Any = None  # a replacement actor's start call, while it waits for room
    deaths: list[str] = field(default_factory=list)
    since: float = field(default_factory=time.monotonic)


class ServePool:
    """Start, watch and stop the replicas of ``llm.serve`` (from the driver).

    Args:
        serve: the recipe's ``llm.serve``.
        model: ``llm.model``, the ``{model}`` the engine serves.
        poll_s: seconds between two looks at every replica.
    """

    def __init__(self, serve: ServeConfig, model: str, *, poll_s: float = POLL_S) -> None:
        self._serve = serve
        self._model = model
        self._poll_s = poll_s
        self._ports = replica_ports(serve.port_range, serve.replicas)
        self._replicas: list[_Replica] = []
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- start -----------------------------------------------------------------------------

    def start(self) -> list[str]:
        """Reserve every replica's resources, start the engines, wait until each answers
        ``/health``; returns their base URLs (``http://HOST:PORT/v1``), replica order.

        Raises:
            ConfigError: the cluster cannot place a replica's bundle within
                ``startup_timeout_s`` (no node offers that many GPUs).
            ServeError: an engine exited or stayed unhealthy while starting.
        """
        from ray.util.placement_group import placement_group

        s = self._serve
        bundle = {s.resource: float(s.gpus_per_replica)}
        if s.cpus_per_replica:
            bundle["CPU"] = s.cpus_per_replica
        for i, port in enumerate(self._ports):
            pg = placement_group([bundle], strategy="STRICT_PACK", name=f"factory-serve-{i}")
            self._replicas.append(_Replica(index=i, port=port, pg=pg))
        deadline = time.monotonic() + s.startup_timeout_s
        for r in self._replicas:
            try:
                ray.get(r.pg.ready(), timeout=max(1.0, deadline - time.monotonic()))
            except ray.exceptions.GetTimeoutError as exc:
                raise ConfigError(
                    f"replica {r.index}: no node of the cluster offered {bundle} within "
                    f"{s.startup_timeout_s:g}s (cluster resources: "
                    f"{_resources_summary()}); lower llm.serve.gpus_per_replica or add nodes",
                    key_path="llm.serve",
                ) from exc
        for r in self._replicas:
            self._launch(r)
        for r in self._replicas:
            self._await_healthy(r, deadline)
        print(
            f"llm.serve: {len(self._replicas)} replica(s) of {self._model} healthy: "
            + ", ".join(r.url for r in self._replicas),
            file=console(),
        )
        self._monitor = threading.Thread(target=self._watch, name="factory-serve", daemon=True)
        self._monitor.start()
        return [r.url for r in self._replicas]

    def _launch(self, r: _Replica, *, wait: bool = True) -> None:
        """A new actor in the replica's bundle, its engine started; ``wait=False``: the
        start is looked at by later polls (``_placed``), so a replica whose node is gone
        waits for Ray to place its bundle again without holding up the others."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        s = self._serve
        options: dict[str, Any] = {
            "num_cpus": s.cpus_per_replica,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=r.pg, placement_group_bundle_index=0
            ),
        }
        if s.resource == "GPU":
            options["num_gpus"] = s.gpus_per_replica
        else:
            options["resources"] = {s.resource: float(s.gpus_per_replica)}
        # {python} stays for the actor to fill: the driver's interpreter path means
        # nothing on another node.
        command = engine_command(s, model=self._model, port=r.port, python="{python}")
        r.actor = ReplicaActor.options(**options).remote(  # type: ignore[attr-defined]
            command, r.port, s.host
        )
        start = r.actor.start.remote()
        if not wait:
            r.placing, r.state, r.since = start, "placing", time.monotonic()
            return
        self._started(r, ray.get(start, timeout=s.startup_timeout_s))

    def _started(self, r: _Replica, info: dict[str, Any]) -> None:
        url = f"http://{advertised_host(self._serve.host, info['node_ip'])}:{r.port}/v1"
        if r.url and url != r.url:
            print(
                f"llm.serve: replica {r.index} came back on another node, {url} (was {r.url}); "
                "the run's workers know the old address: it serves the next run",
                file=console(),
            )
        r.url = url
        r.placing, r.state, r.since = None, "starting", time.monotonic()

    def _placed(self, r: _Replica) -> None:
        """A replacement waiting for room: started now? (Ray places a lost node's bundle
        again once a node has the resources; until then the others serve the run.)"""
        done, _ = ray.wait([r.placing], timeout=0)
        if not done:
            return
        try:
            info = ray.get(r.placing)
        except ray.exceptions.RayError as exc:
            r.placing = None
            self._replace(r, f"replacement lost: {type(exc).__name__}", new_actor=True)
            return
        self._started(r, info)
        print(f"llm.serve: replica {r.index} placed again; starting its engine", file=console())

    def _await_healthy(self, r: _Replica, deadline: float) -> None:
        while True:
            st = ray.get(r.actor.status.remote(), timeout=60)
            if st["healthy"]:
                r.state, r.since = "healthy", time.monotonic()
                return
            if not st["running"]:
                raise ServeError(
                    f"llm.serve replica {r.index} (port {r.port}): "
                    f"{describe_exit(st['returncode'])} while starting; its last lines:\n"
                    f"{st['tail']}"
                )
            if time.monotonic() > deadline:
                raise ServeError(
                    f"llm.serve replica {r.index} (port {r.port}) did not answer /health "
                    f"within {self._serve.startup_timeout_s:g}s (llm.serve.startup_timeout_s)"
                )
            time.sleep(0.5)

    # -- watch -----------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            for r in self._replicas:
                if self._stop.is_set():
                    return
                try:
                    self._check(r)
                except Exception:  # a look that failed is retried at the next poll
                    log.debug("replica %d: check failed", r.index, exc_info=True)

    def _check(self, r: _Replica) -> None:
        if r.state == "failed":
            return
        if r.state == "placing":
            self._placed(r)
            return
        lost = ""
        try:
            st: dict[str, Any] | None = ray.get(r.actor.status.remote(), timeout=60)
        except (
            ray.exceptions.RayActorError,
            ray.exceptions.ActorUnavailableError,
            ray.exceptions.GetTimeoutError,
        ) as exc:
            st, lost = None, f"actor lost: {type(exc).__name__}"
        action, reason = replica_action(
            r.state, st, time.monotonic() - r.since, self._serve.startup_timeout_s
        )
        if action == "replace_actor":
            self._replace(r, lost, new_actor=True)
        elif action == "restart":
            self._replace(r, reason, new_actor=False)
        elif action == "healthy":
            if r.state != "healthy":
                print(f"llm.serve: replica {r.index} healthy again on {r.url}", file=console())
            r.state = "healthy"
        elif action == "down":
            r.state, r.since = "down", time.monotonic()

    def _replace(self, r: _Replica, reason: str, *, new_actor: bool) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            r.deaths.append(reason)
            if r.restarts >= self._serve.max_restarts:
                r.state = "failed"
                print(
                    f"llm.serve: replica {r.index} ({reason}) is left down: "
                    f"{r.restarts} restarts (llm.serve.max_restarts)",
                    file=console(),
                )
                return
            r.restarts += 1
            print(f"llm.serve: replica {r.index} {reason}; restarting it", file=console())
            if new_actor:
                with contextlib.suppress(Exception):
                    ray.kill(r.actor, no_restart=True)
                self._launch(r, wait=False)  # its node may be gone: wait for room, unblocked
            else:
                ray.get(r.actor.start.remote(), timeout=self._serve.startup_timeout_s)
                r.state, r.since = "starting", time.monotonic()

    # -- stop and report -------------------------------------------------------------------

    def stop(self, timeout_s: float = STOP_GRACE_S + 60.0) -> None:
        """Stop the monitor, every engine and actor, and free the placement groups.
        Safe to call twice and after a failed ``start``.

        Bounded by ``timeout_s``: after a Ctrl-C that also took a local Ray's GCS down,
        Ray calls may block on reconnecting; the run must still exit, and what is left
        ends anyway (the actors die with their owner, the guards with the actors).
        """
        stopper = threading.Thread(target=self._stop_all, name="factory-serve-stop", daemon=True)
        stopper.start()
        stopper.join(timeout_s)
        if stopper.is_alive():
            log.warning("llm.serve: replicas not confirmed stopped after %.0fs", timeout_s)

    def _stop_all(self) -> None:
        from ray.util.placement_group import remove_placement_group

        self._stop.set()
        with self._lock:
            pass  # a replacement under way finishes first
        if self._monitor is not None:
            self._monitor.join(timeout=120)
        stops = [r.actor.stop.remote() for r in self._replicas if r.actor is not None]
        with contextlib.suppress(Exception):
            ray.wait(stops, num_returns=len(stops), timeout=STOP_GRACE_S + 15)
        for r in self._replicas:
            if r.actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(r.actor, no_restart=True)
                r.actor = None
            with contextlib.suppress(Exception):
                remove_placement_group(r.pg)
            r.state = "stopped"

    def report(self) -> dict[str, Any]:
        """For the manifest: each replica's URL, state, restarts and why it died."""
        return {
            "model": self._model,
            "replicas": [
                {
                    "index": r.index,
                    "url": r.url,
                    "state": r.state,
                    "restarts": r.restarts,
                    "deaths": list(r.deaths),
                }
                for r in self._replicas
            ],
            "restarts": sum(r.restarts for r in self._replicas),
        }


def _resources_summary() -> str:
    try:
        total = ray.cluster_resources()
    except Exception:
        return "unknown"
    return ", ".join(f"{k}={v:g}" for k, v in sorted(total.items()) if "node:" not in k)


@contextlib.contextmanager
def serving(cfg: Recipe) -> Iterator[ServePool | None]:
    """Bring the recipe's pool up around a run: ``cfg.llm.endpoints`` become the replicas'
    URLs inside the block; every replica is stopped when it exits, however it exits.
    Yields ``None`` (and does nothing) when the recipe has no ``llm.serve``.

    Raises:
        ConfigError: ``llm.serve`` together with ``llm.endpoints``, or a judge model
            other than ``llm.model`` (the pool serves one model).
    """
    if cfg.llm is None or cfg.llm.serve is None:
        yield None
        return
    if "endpoints" in cfg.llm.model_fields_set:
        raise ConfigError(
            "llm.serve starts the run's own servers and replaces llm.endpoints: drop one of "
            "them (--devserver sets llm.endpoints)",
            key_path="llm.serve",
        )
    judge = cfg.prefilter.model if cfg.prefilter.enabled else None
    if judge not in (None, cfg.llm.model):
        raise ConfigError(
            f"the judge's model {short(judge, 80)} is not served: with llm.serve the pool "
            f"serves llm.model ({short(cfg.llm.model, 80)}) only; drop prefilter.model",
            key_path="prefilter.model",
        )
    from factory.engine.raycompat import init_ray

    init_ray(cfg.ray.address)
    pool = ServePool(cfg.llm.serve, cfg.llm.model)
    try:
        urls = pool.start()
        cfg.llm.endpoints = [EndpointConfig(base_url=u) for u in urls]  # type: ignore[call-arg]
        yield pool
    finally:
        pool.stop()
