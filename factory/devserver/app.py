"""The development LLM server: an OpenAI-compatible aiohttp app that simulates a model.

Why a real HTTP server instead of a mocked client: retries, timeouts,
connection pools, 429 handling and prefix-cache accounting are exactly what
the factory's LLM layer must get right, and they only show up over a socket.
The server behaves like a queueing vLLM endpoint -- at most
``max_concurrency`` requests are "generated" at once, each taking a sampled
latency, the rest wait -- and injects the failures real endpoints produce, at
configured rates, deterministically under a seed.

Determinism: every random choice of a request derives from ``seed`` and a hash
of the request body. The *content* ignores the attempt number, so a retried
request gets the same answer once it succeeds; the *defect draw* and latency
include a per-body attempt counter, so a 429 at rate 0.1 is not repeated
forever.

Running the app (on the current loop, or in a thread for tests) is
``factory.devserver.server``. At about 630 lines this module is one thing: the
app's configuration, its per-server state and the handlers that read it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import random
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, NoReturn, TextIO

from aiohttp import web

from factory.devserver import (
    anthropic,
    anthropic_batches,
    batches,
    gemini,
    gemini_batches,
    grounded,
    roles,
    simulate,
    textaction,
)
from factory.devserver.ratelimit import RateLimiter
from factory.errors import ConfigError

__all__ = ["DEFECTS", "DevServerConfig", "build_app", "parse_defects", "serve_chat"]

HOST = "127.0.0.1"
TRANSPORT_DEFECTS: tuple[str, ...] = ("rate_limit", "server_error", "stall")
DEFECTS: tuple[str, ...] = TRANSPORT_DEFECTS + simulate.CONTENT_DEFECTS
LATENCY_KINDS = ("fixed", "uniform", "lognormal")
FINGERPRINT = "factory-devserver"
_PREFIX_CACHE_SIZE = 200_000
_ATTEMPTS_CAP = 2_000_000
_Z99 = 2.3263478740408408  # standard normal 99th percentile
_CLIENT_GONE = 499  # nginx's "client closed request": no response was delivered


@dataclass
class DevServerConfig:
    """How the simulated model behaves. ``port=0`` binds an ephemeral port.

    ``latency`` is ``fixed`` (``latency_ms``), ``uniform`` (mean ± spread) or
    ``lognormal``: with ``latency_p99_ratio`` set, ``latency_ms`` is the median and the
    99th percentile is ``latency_p99_ratio`` x the median (a heavy tail like real model
    latencies: ratio 10 gives sigma = ln(10) / 2.326 = 0.99, mean = 1.63 x median);
    without it, ``latency_ms`` is the mean and ``latency_spread_ms`` the standard
    deviation. ``/stats`` reports the mean latency actually served
    (``latency_mean_s``), so a benchmark derives its limit C / mean from the same run.
    ``defects`` maps a name of ``DEFECTS`` to its rate; rates add up to at most 1.
    ``sim_drop_change`` is the share of simulate answers (with at least one
    change) that leave one change out; it is drawn per request body, like the
    content, independently of ``defects``. ``wrong_observation`` is the share of
    amplification answers (with a tool message) in which one observation
    contradicts the world (``grounded.corrupt_observation``), drawn the same way.
    ``rate_rpm`` / ``rate_tpm`` meter a provider's budget (``factory.devserver.ratelimit``):
    every chat answer then carries OpenAI's ``x-ratelimit-*`` headers, and a request
    beyond the budget gets a 429 with ``Retry-After`` (``/stats``: ``rate_limited``).
    """

    port: int = 0
    models: tuple[str, ...] = ("factory-dev",)
    strict_models: bool = False
    latency: str = "fixed"
    latency_ms: float = 0.0
    latency_spread_ms: float = 0.0
    latency_p99_ratio: float | None = None
    max_concurrency: int = 256
    defects: dict[str, float] = field(default_factory=dict)
    retry_after_s: float = 1.0
    stall_s: float = 300.0
    fence_rate: float = 0.2
    seed: int = 0
    request_log: str | None = None
    fail_after: int | None = None
    sim_drop_change: float = 0.0
    wrong_observation: float = 0.0
    repeat: float = 0.0
    # Batch API (``factory.devserver.batches``): seconds a batch takes, share of its
    # requests answered with an error line, the first N batches created that fail
    # validation, the next M that expire after answering ``batch_expire_keep`` of them.
    batch_delay_s: float = 1.0
    batch_error_rate: float = 0.0
    batch_fail_first: int = 0
    batch_expire_first: int = 0
    batch_expire_keep: float = 0.5
    # Anthropic Messages (``factory.devserver.anthropic``): the ``server_error`` defect
    # answers 529 ``overloaded_error`` there instead of 500 ``api_error``.
    anthropic_overloaded: bool = False
    # Gemini API (``factory.devserver.gemini``): the shortest prefix a context cache takes.
    gemini_cache_min_tokens: int = 1024
    # A provider's budget (``factory.devserver.ratelimit``): requests and tokens per minute
    # (None: unlimited), each bucket holding ``rate_window_s`` seconds of it.
    rate_rpm: float | None = None
    rate_tpm: float | None = None
    rate_window_s: float = 60.0

    def __post_init__(self) -> None:
        self.models = tuple(self.models)
        if not self.models or not all(isinstance(m, str) and m for m in self.models):
            raise ConfigError("give at least one non-empty model id", key_path="devserver.models")
        if self.latency not in LATENCY_KINDS:
            raise ConfigError(
                f"unknown latency kind {self.latency!r}; use one of {', '.join(LATENCY_KINDS)}",
                key_path="devserver.latency",
            )
        if self.latency_p99_ratio is not None and (
            self.latency != "lognormal" or self.latency_p99_ratio < 1.0
        ):
            raise ConfigError(
                "needs latency 'lognormal' and a ratio >= 1", key_path="devserver.latency_p99_ratio"
            )
        for key in ("latency_ms", "latency_spread_ms", "retry_after_s", "stall_s",
                    "batch_delay_s"):  # fmt: skip
            if getattr(self, key) < 0:
                raise ConfigError("must be >= 0", key_path=f"devserver.{key}")
        if self.max_concurrency < 1:
            raise ConfigError("must be >= 1", key_path="devserver.max_concurrency")
        RateLimiter(self.rate_rpm, self.rate_tpm, window_s=self.rate_window_s)  # the checks
        if not 0.0 <= self.fence_rate <= 1.0:
            raise ConfigError("must be within [0, 1]", key_path="devserver.fence_rate")
        rates = (
            "sim_drop_change", "wrong_observation", "repeat", "batch_error_rate",
            "batch_expire_keep",
        )  # fmt: skip
        for key in rates:
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError("must be within [0, 1]", key_path=f"devserver.{key}")
        if self.fail_after is not None and self.fail_after < 0:
            raise ConfigError("must be >= 0", key_path="devserver.fail_after")
        for name, rate in self.defects.items():
            if name not in DEFECTS:
                raise ConfigError(
                    f"unknown defect {name!r}; known: {', '.join(DEFECTS)}",
                    key_path="devserver.defects",
                )
            if not 0.0 <= rate <= 1.0:
                raise ConfigError(
                    f"rate of {name} must be within [0, 1]", key_path="devserver.defects"
                )
        if sum(self.defects.values()) > 1.0 + 1e-9:
            raise ConfigError(
                "defect rates add up to more than 1; each request gets at most one defect",
                key_path="devserver.defects",
            )


def parse_defects(spec: str) -> dict[str, float]:
    """``"malformed_json=0.05,rate_limit=0.1"`` -> ``{"malformed_json": 0.05, "rate_limit": 0.1}``.

    Raises:
        ConfigError: an item is not ``name=rate`` with a numeric rate.
    """
    out: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, sep, rate = item.partition("=")
        try:
            out[name.strip()] = float(rate)
        except ValueError:
            sep = ""
        if not sep:
            raise ConfigError(f"expected name=rate, got {item!r}", key_path="devserver.defects")
    return out


def _seed_int(seed: int, digest: bytes, tag: str) -> int:
    h = hashlib.blake2b(digest, digest_size=8, key=f"{seed}:{tag}".encode()[:64])
    return int.from_bytes(h.digest(), "big")


def _tokens(text: str) -> int:
    return (len(text) + 3) // 4


def _message_tokens(message: dict[str, Any]) -> tuple[str, str, int]:
    """A message's text, its tool calls' JSON and their estimated tokens (4 a message
    for the role and separators)."""
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    extra = json.dumps(message["tool_calls"]) if message.get("tool_calls") else ""
    return text, extra, _tokens(text) + _tokens(extra) + 4


def _request_tokens(payload: dict[str, Any]) -> int:
    """What a request costs against a token budget: its estimated prompt tokens plus
    the output it may ask for (``factory.devserver.ratelimit`` says why)."""
    tools = payload.get("tools")
    prompt = _tokens(json.dumps(tools)) if tools else 0
    prompt += sum(_message_tokens(m)[2] for m in payload["messages"])
    most = payload.get("max_completion_tokens") or payload.get("max_tokens") or 0
    return prompt + (most if isinstance(most, int) and most > 0 else 0)


def _error(
    status: int,
    message: str,
    kind: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An error body shaped like OpenAI's, which the SDK turns into its typed exceptions."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=headers
    )


class _State:
    """Counters, caches and the queue of one server; lives on the server's event loop."""

    def __init__(self, config: DevServerConfig) -> None:
        self.config = config
        self.started = time.time()
        self.slots = asyncio.Semaphore(config.max_concurrency)
        # One answer's generation (~1.5 ms of CPU for an amplification) per turn of the
        # loop, with the loop's look at its sockets in between, so a request's latency
        # clock starts when it arrives, not after the generation of every request that came
        # with it. Without it a burst of N requests whose bodies came in one segment with
        # their headers (aiohttp writes them so) was stamped and answered up to N x 1.5 ms
        # late, while the same burst from a client that writes the body apart (httpx) got
        # its answers after the latency alone: the server charged its own CPU to one kind
        # of client.
        self.cpu = asyncio.Lock()
        self.counts: Counter[str] = Counter()
        self.by_status: Counter[str] = Counter()
        self.by_defect: Counter[str] = Counter()
        self.by_kind: Counter[str] = Counter()
        self.latency_total = 0.0  # sampled generation latency of completed requests
        self.open = self.in_flight = self.max_in_flight = self.waiting = self.max_waiting = 0
        self.attempts: dict[bytes, int] = {}
        self.prefixes: OrderedDict[bytes, int] = OrderedDict()
        # Every open connection, idle keep-alive ones included (``track_connections``):
        # dying drops them all, as a killed process would, and none is left for the
        # garbage collector to find unclosed.
        self.connections: dict[Any, asyncio.Transport] = {}  # aiohttp handler -> transport
        self.log: TextIO | None = None
        self.dead = False
        self.died: asyncio.Event | None = None
        self.runner: web.AppRunner | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.defect_table: list[tuple[float, str]] = []
        self.limiter = (
            RateLimiter(config.rate_rpm, config.rate_tpm, window_s=config.rate_window_s)
            if config.rate_rpm is not None or config.rate_tpm is not None
            else None
        )
        # References answered as themselves, in arrival order (``repeat``), at most 4096.
        self.answered: list[simulate.Reference] = []
        total = 0.0
        for name in DEFECTS:
            if config.defects.get(name):
                total += config.defects[name]
                self.defect_table.append((total, name))

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests": self.counts["requests"],
            "completed": self.counts["completed"],
            "by_status": dict(self.by_status),
            "by_defect": dict(self.by_defect),
            "by_kind": dict(self.by_kind),
            "open": self.open,
            "connections": len(self.connections),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "waiting": self.waiting,
            "max_waiting": self.max_waiting,
            "prompt_tokens": self.counts["prompt_tokens"],
            "cached_tokens": self.counts["cached_tokens"],
            "completion_tokens": self.counts["completion_tokens"],
            "latency_mean_s": round(self.latency_total / self.counts["completed"], 6)
            if self.counts["completed"]
            else None,
            "sim_dropped_changes": self.counts["sim_dropped_changes"],
            "grounded_answers": self.counts["grounded_answers"],
            "wrong_observations": self.counts["wrong_observations"],
            "repeated_answers": self.counts["repeated_answers"],
            "rate_limited": self.counts["rate_limited"],
            "alive": not self.dead,
            "uptime_s": round(time.time() - self.started, 3),
        }

    # --- per-request draws -----------------------------------------------------------
    def draw_defect(self, rng: random.Random) -> str | None:
        if not self.defect_table:
            return None
        u = rng.random()
        for bound, name in self.defect_table:
            if u < bound:
                return name
        return None

    def latency_s(self, rng: random.Random) -> float:
        c = self.config
        mean, spread = c.latency_ms / 1000.0, c.latency_spread_ms / 1000.0
        if c.latency == "uniform":
            return rng.uniform(max(0.0, mean - spread), mean + spread)
        if c.latency == "lognormal" and mean > 0 and c.latency_p99_ratio is not None:
            # ``latency_ms`` is the median; p99 = median * exp(2.326 sigma).
            sigma = math.log(c.latency_p99_ratio) / _Z99
            return rng.lognormvariate(math.log(mean), sigma)
        if c.latency == "lognormal" and mean > 0:
            sigma2 = math.log1p((spread / mean) ** 2)
            return rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))
        return mean

    def next_attempt(self, digest: bytes) -> int:
        if len(self.attempts) >= _ATTEMPTS_CAP:
            self.attempts.clear()
        attempt = self.attempts.get(digest, 0)
        self.attempts[digest] = attempt + 1
        return attempt

    def prompt_usage(
        self, model: str, messages: list[dict[str, Any]], tools: Any
    ) -> tuple[int, int]:
        """Estimated prompt tokens and how many of them a prefix cache would already hold."""
        h = hashlib.blake2b(model.encode(), digest_size=16)
        total = _tokens(json.dumps(tools)) if tools else 0
        cached = 0
        keys: list[tuple[bytes, int]] = []
        for m in messages:
            text, extra, tokens = _message_tokens(m)
            h.update(f"\x1e{m.get('role')}\x1f{m.get('name') or ''}\x1f{text}\x1f{extra}".encode())
            total += tokens
            key = h.digest()
            if key in self.prefixes:
                cached = total
                self.prefixes.move_to_end(key)
            keys.append((key, total))
        for key, upto in keys:
            self.prefixes[key] = upto
        while len(self.prefixes) > _PREFIX_CACHE_SIZE:
            self.prefixes.popitem(last=False)
        return total, cached

    def record(
        self,
        digest: bytes,
        attempt: int,
        kind: str,
        status: int,
        defect: str | None,
        *,
        received: float | None = None,
        request_id: str | None = None,
        limited: str | None = None,
    ) -> None:
        self.by_status[str(status)] += 1
        if defect:
            self.by_defect[defect] += 1
        if status == 200:
            self.counts["completed"] += 1
        if self.log is not None:
            row = {
                "time": round(time.time(), 6),  # when the answer (or the error) was sent
                "received": round(received, 6) if received is not None else None,
                "request_id": request_id,  # the client's X-Client-Request-Id
                "body_hash": digest.hex(),
                "attempt": attempt,
                "kind": kind,
                "status": status,
                "defect": defect,
                "rate_limited": limited,  # the budget that refused it (--rpm / --tpm)
                "completed": status == 200,
            }
            self.log.write(json.dumps(row) + "\n")

    def log_line(self, **row: Any) -> None:
        """One line of the request log (the Batch API's events)."""
        if self.log is not None:
            self.log.write(json.dumps({"time": round(time.time(), 6), **row}) + "\n")

    # --- death -------------------------------------------------------------------------
    def die(self) -> None:
        """Drop every connection and stop listening, as if the process had been killed."""
        if self.dead:
            return
        self.dead = True
        self.stop_accepting()
        self.drop_connections()
        task = asyncio.get_running_loop().create_task(self._cleanup())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def stop_accepting(self) -> None:
        """Stop taking connections off the listening sockets; closing them comes later.

        Why before the close: asyncio accepts a connection in one loop step and makes its
        transport in a task that runs in the next. A server closed in between makes that
        transport fail half-built (Python 3.11 asserts in ``Server._attach``), and the
        socket is then found, unclosed, by the garbage collector: CI failed on twelve such
        ResourceWarnings in the test whose server dies mid-run. With the listening sockets'
        readers removed first, every accepted connection is completed (and, the server
        being dead, reset) before ``runner.cleanup()`` closes them.
        """
        if self.runner is None:
            return
        loop = asyncio.get_running_loop()
        for site in self.runner.sites:
            server = getattr(site, "_server", None)  # aiohttp keeps the asyncio.Server here
            for sock in getattr(server, "sockets", None) or ():
                loop.remove_reader(sock.fileno())

    def drop_connections(self) -> None:
        """Reset every open connection (each transport's ``connection_lost`` forgets it)."""
        for transport in list(self.connections.values()):
            transport.abort()

    def track_connections(self, server: web.Server) -> None:
        """Keep ``connections`` in step with the connections ``server`` accepts and loses.

        Why: once aiohttp has shut a server down it holds no connection, and one that
        nothing closed is found by the garbage collector (a CI run failed on four
        such server-side sockets, as ResourceWarnings). Held here, each is reset when
        the server dies or stops; one accepted after death is reset at once.
        """
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            self.connections[handler] = transport
            made(handler, transport)
            if self.dead:
                transport.abort()

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self.connections.pop(handler, None)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    async def _cleanup(self) -> None:
        if self.runner is not None:
            runner, self.runner = self.runner, None
            for _ in range(3):  # the accepts already taken make their transports first
                await asyncio.sleep(0)
            await runner.cleanup()
        if self.died is not None:
            self.died.set()


_STATE: web.AppKey[_State] = web.AppKey("state", _State)


# --------------------------------------------------------------------------------------
# Handlers
# --------------------------------------------------------------------------------------
async def _drop(transport: asyncio.Transport | None) -> NoReturn:
    """Reset the connection without an answer, like a killed process would."""
    if transport is not None:
        transport.abort()  # connection_lost then cancels this handler (handler_cancellation)
    await asyncio.sleep(5)
    raise asyncio.CancelledError


async def _models(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    data = [
        {"id": m, "object": "model", "created": 0, "owned_by": "factory"}
        for m in state.config.models
    ]
    return web.json_response({"object": "list", "data": data})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[_STATE].snapshot())


async def _admin_stop(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    asyncio.get_running_loop().call_later(0.05, state.die)
    return web.json_response({"status": "stopping"})


def _validate(payload: Any, state: _State) -> web.Response | None:
    if not isinstance(payload, dict):
        return _error(400, "The request body must be a JSON object.", "invalid_request_error")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return _error(
            400, "'messages' is a required property and must be a non-empty array.",
            "invalid_request_error", "messages",
        )  # fmt: skip
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return _error(
            400, "Each message needs a string 'role'.", "invalid_request_error", "messages"
        )
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        return _error(400, "'model' is a required property.", "invalid_request_error", "model")
    if state.config.strict_models and model not in state.config.models:
        return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    if payload.get("stream"):
        return _error(400, "Streaming is not supported by the factory devserver.",
                      "invalid_request_error", "stream")  # fmt: skip
    return None


def _kind_of(messages: list[Any]) -> str:
    """What a prompt asks for: a simulated RL role, else a pipeline prompt's kind (one
    rule for the online and the Batch path)."""
    return roles.kind_of(messages) or simulate.prompt_kind(messages)


def _simulation(
    kind: str, text: str, state: _State, digest: bytes
) -> tuple[dict[str, Any] | None, bool]:
    """The perfect simulator's answer (in the prompt's layout), maybe with one change
    dropped; (answer, dropped)."""
    if kind == "simulate_envsimbench":
        answer = simulate.simulate_envsimbench(text)
    else:
        read = simulate.read_simulation(text)
        answer = simulate.simulate_call(*read) if read is not None else None
    rate = state.config.sim_drop_change
    if answer is None or not rate or not answer["config_changes"]:
        return answer, False
    rng = random.Random(_seed_int(state.config.seed, digest, "sim_drop"))
    return answer, rng.random() < rate and simulate.drop_change(answer, rng)


def _amplification(
    text: str,
    ref: simulate.Reference,
    state: _State,
    digest: bytes,
    crng: random.Random,
    events: list[str],
) -> dict[str, Any]:
    """The new trajectory: grounded in the prompt's environment state when it has one."""
    trajectory = None
    scenario = grounded.read_scenario(text)
    if scenario is not None:
        reference = simulate.reference_messages(ref)
        trajectory = grounded.grounded_trajectory(scenario, reference, crng)
        if trajectory is not None:
            events.append("grounded_answers")
    if trajectory is None:
        trajectory = simulate.amplify(_repeat_source(ref, state, digest, events), crng)
    rate = state.config.wrong_observation
    if rate:
        wrng = random.Random(_seed_int(state.config.seed, digest, "wrong_observation"))
        if wrng.random() < rate and grounded.corrupt_observation(trajectory, wrng):
            events.append("wrong_observations")
    return trajectory


def _repeat_source(
    ref: simulate.Reference, state: _State, digest: bytes, events: list[str]
) -> simulate.Reference:
    """The reference to answer from: with ``repeat``, a share of answers are renamed
    copies of an *earlier* request's reference (a model repeating itself across
    prompts: planted near-duplicates, issue 13); the others answer their own."""
    rate = state.config.repeat
    if not rate:
        return ref
    rng = random.Random(_seed_int(state.config.seed, digest, "repeat"))
    earlier = [r for r in state.answered if r is not ref]
    if earlier and rng.random() < rate:
        events.append("repeated_answers")
        return rng.choice(earlier)
    if not any(r is ref for r in state.answered) and len(state.answered) < 4096:
        state.answered.append(ref)
    return ref


def _complete(
    payload: dict[str, Any],
    kind: str,
    state: _State,
    digest: bytes,
    defect: str | None,
    drng: random.Random,
) -> tuple[str, str | None, str, list[str]]:
    """Generate the answer; returns (content, applied defect, finish_reason, counted events).

    Events name the ``/stats`` counters the answer adds one to once it is delivered.
    """
    messages = payload["messages"]
    crng = random.Random(_seed_int(state.config.seed, digest, "content"))
    fence = state.config.fence_rate
    applied = defect if defect in TRANSPORT_DEFECTS else None
    events: list[str] = []
    if kind == "other":
        return simulate.answer_other(messages), applied, "stop", events
    if kind in roles.KINDS:  # the roles of a simulated RL environment (factory.simenv)
        return roles.answer(kind, messages, crng), applied, "stop", events
    text = simulate.last_user_text(messages)
    if kind in ("simulate", "simulate_envsimbench"):
        answer, dropped = _simulation(kind, text, state, digest)
        if dropped:
            events.append("sim_dropped_changes")
        if answer is None:
            return (
                "I could not read the state or the tool call to simulate.",
                applied,
                "stop",
                events,
            )
        content = simulate.render_json(answer, crng, fence)
        if defect == "malformed_json":
            content, finish = simulate.break_json(content, drng)
            return content, defect, finish, events
        return content, applied, "stop", events
    grammar = textaction.grammar_in(messages)
    if grammar is not None:  # a text-action domain's prompt (its grammar in the prompt)
        value, done = textaction.answer(kind, messages, grammar, crng, defect, drng)
        if value is None:
            return "I could not read the reference episode.", applied, "stop", events
        content = simulate.render_json(value, crng, fence)
        applied = done or applied
        if defect == "malformed_json":
            content, finish = simulate.break_json(content, drng)
            return content, defect, finish, events
        return content, applied, "stop", events
    marker = simulate.AMPLIFY_MARKER if kind == "amplify" else simulate.JUDGE_MARKER
    block = simulate.extract_block(text, marker)
    ref = simulate.reference_from_block(block) if block is not None else None
    if kind == "judge":
        content = simulate.render_json(simulate.judge(ref), crng, fence)
    elif ref is None:
        return (
            "I could not read the reference trajectory, so I cannot write a new one.",
            applied,
            "stop",
            events,
        )
    else:
        trajectory = _amplification(text, ref, state, digest, crng, events)
        if defect in ("unknown_tool", "wrong_arg_type", "missing_observation"):
            avoid = text + json.dumps(payload.get("tools") or [])
            if simulate.inject_defect(trajectory, defect, drng, avoid=avoid):
                applied = defect
        content = simulate.render_json(trajectory, crng, fence)
    if defect == "malformed_json":
        content, finish = simulate.break_json(content, drng)
        return content, defect, finish, events
    return content, applied, "stop", events


async def _chat(request: web.Request) -> web.StreamResponse:
    return await serve_chat(request, None)


async def serve_chat(request: web.Request, body: bytes | None) -> web.StreamResponse:
    """Answer one chat-completions request: ``body`` (its JSON bytes), or the request's own
    body when ``None``.

    Why a function of the body: the other wire formats the server speaks (Anthropic
    Messages, Gemini generateContent: ``factory.devserver.anthropic``, ``.gemini``)
    translate their request into a chat-completions body, answer it here (defects,
    queueing, latency, content and prefix-cache accounting are one implementation) and
    translate the answer back."""
    arrived = time.monotonic()
    received = time.time()
    # Let every request that arrived in the same instant start its clock before this one
    # spends CPU (see _State.cpu for why).
    await asyncio.sleep(0)
    state = request.app[_STATE]
    transport = request.transport
    if state.dead or transport is None:
        await _drop(transport)
    assert transport is not None
    state.counts["requests"] += 1
    if state.config.fail_after is not None and state.counts["requests"] > state.config.fail_after:
        state.die()
        await _drop(transport)
    if body is None:
        body = await request.read()
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    problem = (
        _validate(payload, state)
        if payload is not None
        else _error(400, "The request body is not valid JSON.", "invalid_request_error")
    )
    if problem is not None:
        state.by_status[str(problem.status)] += 1
        return problem
    digest = hashlib.blake2b(body, digest_size=16).digest()
    attempt = state.next_attempt(digest)
    drng = random.Random(_seed_int(state.config.seed, digest, f"attempt:{attempt}"))
    defect = state.draw_defect(drng)
    kind = _kind_of(payload["messages"])
    status = _CLIENT_GONE
    applied = defect if defect in TRANSPORT_DEFECTS else None  # content defects once applied
    state.by_kind[kind] += 1
    state.open += 1
    limited: str | None = None
    budget: dict[str, str] = {}  # the rate-limit headers every answer carries (--rpm/--tpm)
    try:
        if state.limiter is not None:
            admission = state.limiter.admit(_request_tokens(payload))
            budget = admission.headers
            if admission.limited is not None:
                status, limited, applied = 429, admission.limited, None
                state.counts["rate_limited"] += 1
                return _error(
                    429, f"Rate limit reached for {limited} per min (the factory devserver's "
                    f"--{'rpm' if limited == 'requests' else 'tpm'}). Please try again in "
                    f"{admission.retry_after_s:.3f}s.", limited, None, budget,
                )  # fmt: skip
        if defect == "rate_limit":
            status = 429
            retry = state.config.retry_after_s
            return _error(
                429, "Rate limit reached for requests (simulated by the factory devserver).",
                "requests", None, {**budget, "Retry-After": str(math.ceil(retry)),
                                   "retry-after-ms": str(int(retry * 1000))},
            )  # fmt: skip
        if defect == "server_error":
            status = 500
            return _error(
                500, "The server had an error while processing your request.", "server_error",
                headers=budget or None,
            )  # fmt: skip
        if defect == "stall":
            await asyncio.sleep(state.config.stall_s)
        latency = state.latency_s(drng)
        if state.slots.locked():  # all slots busy: queue like a saturated vLLM server
            state.waiting += 1
            state.max_waiting = max(state.max_waiting, state.waiting)
            try:
                await state.slots.acquire()
            finally:
                state.waiting -= 1
            arrived = time.monotonic()  # generation starts once a slot is free
        else:
            await state.slots.acquire()
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            async with state.cpu:
                content, applied, finish, events = _complete(
                    payload, kind, state, digest, defect, drng
                )
                prompt_tokens, cached = state.prompt_usage(
                    payload["model"], payload["messages"], payload.get("tools")
                )
                completion_tokens = _tokens(content)
                response = _completion(
                    f"chatcmpl-{digest.hex()[:24]}{attempt:04x}",
                    payload["model"],
                    content,
                    finish,
                    (prompt_tokens, cached, completion_tokens),
                )
                text = json.dumps(response, ensure_ascii=False)
                await asyncio.sleep(0)  # hold the turn until the loop has read its sockets
            await asyncio.sleep(max(0.0, latency - (time.monotonic() - arrived)))
        finally:
            state.in_flight -= 1
            state.slots.release()
        state.counts["prompt_tokens"] += prompt_tokens
        state.counts["cached_tokens"] += cached
        state.counts["completion_tokens"] += completion_tokens
        state.counts.update(events)
        state.latency_total += latency
        status = 200
        return web.Response(text=text, content_type="application/json", headers=budget or None)
    finally:
        state.open -= 1
        state.record(
            digest,
            attempt,
            kind,
            status,
            applied,
            received=received,
            request_id=request.headers.get("X-Client-Request-Id"),
            limited=limited,
        )


def _batch_answer(state: _State, body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion of one Batch API line: what ``/v1/chat/completions`` answers,
    without transport defects or latency (the batch has its own delay)."""
    raw = json.dumps(body, sort_keys=True).encode()
    digest = hashlib.blake2b(raw, digest_size=16).digest()
    drng = random.Random(_seed_int(state.config.seed, digest, "batch"))
    kind = _kind_of(body["messages"])
    content, _applied, finish, events = _complete(body, kind, state, digest, None, drng)
    prompt_tokens, cached = state.prompt_usage(body["model"], body["messages"], body.get("tools"))
    completion_tokens = _tokens(content)
    state.counts.update(events)
    state.counts.update(
        completed=1, prompt_tokens=prompt_tokens, cached_tokens=cached,
        completion_tokens=completion_tokens,
    )  # fmt: skip
    return _completion(
        f"chatcmpl-{digest.hex()[:24]}",
        body["model"],
        content,
        finish,
        (prompt_tokens, cached, completion_tokens),
    )


def _completion(
    completion_id: str, model: str, content: str, finish: str, usage: tuple[int, int, int]
) -> dict[str, Any]:
    """A ``chat.completion`` object as OpenAI returns it (``usage``: prompt tokens, of
    which cached, completion tokens), for the online and the batch path alike."""
    prompt_tokens, cached, completion_tokens = usage
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        },
    }


async def _open_log(app: web.Application) -> None:
    state = app[_STATE]
    if state.config.request_log:
        state.log = open(state.config.request_log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115


async def _close_log(app: web.Application) -> None:
    state = app[_STATE]
    if state.log is not None:
        state.log.close()
        state.log = None


def build_app(config: DevServerConfig) -> web.Application:
    """The aiohttp application (routes, state, request log hooks) for ``config``."""
    app = web.Application(client_max_size=256 * 1024**2)  # a 200 MB batch input file
    state = app[_STATE] = _State(config)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/stats", _stats)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/admin/stop", _admin_stop)
    hooks = batches.BatchHooks(config, functools.partial(_batch_answer, state), state.log_line)
    batches.add_routes(app, hooks)
    # The other wire formats: each is one module with ``add_routes(app, hooks, serve_chat)``
    # (its batch API: ``add_routes(app, hooks)``) whose handlers answer through
    # ``serve_chat`` (online) and ``hooks.answer`` (batch).
    anthropic.add_routes(app, hooks, serve_chat)  # Anthropic Messages: /v1/messages
    anthropic_batches.add_routes(app, hooks)  # Message Batches: /v1/messages/batches
    gemini.add_routes(app, hooks, serve_chat)  # Gemini: /v1{,beta}/models/{model}:{method}
    gemini_batches.add_routes(app, hooks)  # Batch API: models/M:batchGenerateContent, batches
    app.on_startup.append(_open_log)
    app.on_cleanup.append(_close_log)
    return app
