"""A key sent to the LLM server never lands in an output file or a log line.

An amplification runs end to end on Ray with its key read from an environment
variable, through a recording proxy in front of the development server. The
server injects 429s, 500s and malformed completions, and the proxy misbehaves
like a careless gateway: it echoes the request's ``Authorization`` header in
error bodies, in a non-JSON 200 body and inside a completion. Every error path
logs, retries or writes a row. Then every file of the output folder (Parquet
decoded to text), the captured logs and output of the driver, and the Ray
workers' log files are searched for the key: zero hits. The proxy proves the
key was really sent, so the scan is not vacuous.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pyarrow.parquet as pq
import pytest
from aiohttp import web

from factory.run import main
from tests.conftest import ROOT
from tests.helpers import ray_log_files

pytestmark = pytest.mark.ray

KEY_ENV = "FACTORY_SCAN_TEST_KEY"
# Set at import, before any test starts Ray: local Ray workers inherit the
# environment of the session they join, never variables set later. Not shaped
# like an OpenAI key (sk-...), so only the registry of read keys can mask it,
# as for a self-hosted server's key.
os.environ.setdefault(KEY_ENV, f"scan-test-{secrets.token_hex(20)}")
KEY = os.environ[KEY_ENV]
DEFECTS = {"rate_limit": 0.15, "server_error": 0.1, "malformed_json": 0.1, "unknown_tool": 0.05}
_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding", "date", "server"}


class LeakyProxy:
    """A recording reverse proxy on 127.0.0.1 that echoes credentials back now and then.

    Every Nth request (by arrival) gets a misbehaving answer instead of the upstream's:
    a 500 and a 400 whose error message quotes the ``Authorization`` header, a 200
    that is not JSON and quotes it, and a 200 completion whose text quotes it.
    """

    ECHO_500, ECHO_400, ECHO_HTML, ECHO_COMPLETION = 7, 11, 13, 17

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/").removesuffix("/v1")
        self.authorizations: list[str] = []
        self.echoed = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="leaky-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LeakyProxy:
        self._thread.start()
        assert self._ready.wait(10), "proxy did not start"
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._session is not None:
                await self._session.close()
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def boot() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = self._runner.addresses[0][1]
            self._session = aiohttp.ClientSession()
            self._ready.set()

        self._loop.run_until_complete(boot())
        self._loop.run_forever()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        self.authorizations.append(auth)
        n = len(self.authorizations)
        body = await request.read()
        if request.path.endswith("/chat/completions"):
            echo = self._echo(n, auth, body)
            if echo is not None:
                self.echoed += 1
                return echo
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP | {"host"}}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as resp:
            data = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
            return web.Response(status=resp.status, body=data, headers=out)

    def _echo(self, n: int, auth: str, body: bytes) -> web.Response | None:
        if n % self.ECHO_500 == 0:
            message = f"upstream refused the request with Authorization: {auth}"
            return web.json_response({"error": {"message": message}}, status=500)
        if n % self.ECHO_400 == 0:
            message = f"invalid credentials {auth.removeprefix('Bearer ')} for this model"
            return web.json_response({"error": {"message": message}}, status=400)
        if n % self.ECHO_HTML == 0:
            return web.Response(text=f"<html>gateway error, token {auth}</html>", status=200)
        if n % self.ECHO_COMPLETION == 0:
            model = json.loads(body).get("model", "factory-dev")
            text = f"I cannot help. Debug: header was {auth!r}"
            return web.json_response(
                {
                    "id": "chatcmpl-echo",
                    "object": "chat.completion",
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                }
            )
        return None


@pytest.fixture()
def leaky_proxy(devserver) -> Iterator[LeakyProxy]:
    server = devserver(defects=DEFECTS, retry_after_s=0.05, seed=11)
    proxy = LeakyProxy(server.url).start()
    yield proxy
    proxy.stop()


def _needles() -> list[bytes]:
    """The key, its first 16 characters (a copy cut short) and base64 disguises."""
    raw = KEY.encode()
    return [raw, raw[:16], base64.b64encode(raw), base64.b64encode(b"Bearer " + raw)]


def _hits(text: bytes | str, where: str) -> list[str]:
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    return [f"{where}: {needle[:12]!r}..." for needle in _needles() if needle in data]


def scan_folder(folder: Path) -> tuple[list[str], int]:
    """Hits of the key in every file under ``folder``; Parquet is decoded to text first."""
    hits: list[str] = []
    scanned = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        scanned += 1
        data = path.read_bytes()
        hits += _hits(data, str(path))
        if path.suffix == ".parquet":
            rows = pq.read_table(path).to_pylist()
            hits += _hits(json.dumps(rows, ensure_ascii=False, default=str), str(path))
    return hits, scanned


def scan_ray_logs() -> tuple[list[str], int]:
    """Hits in the Ray session's log files (worker stdout/stderr, raylet, GCS)."""
    files = ray_log_files()
    return [h for path in files for h in _hits(path.read_bytes(), str(path))], len(files)


@pytest.mark.parametrize(("transport", "cache"), [("aiohttp", False), ("openai", True)])
def test_key_never_leaves_the_request_header(
    ray_session,
    leaky_proxy: LeakyProxy,
    tmp_path: Path,
    transport: str,
    cache: bool,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "out"
    endpoint = {"base_url": leaky_proxy.url, "api_key_env": KEY_ENV}
    overrides = [
        "llm.model=factory-dev",
        "prefilter.model=factory-dev",
        "llm.endpoints=" + json.dumps([endpoint]),
        f"llm.transport={transport}",
        f"cache.enabled={str(cache).lower()}",
        "llm.retry.max_attempts=2",
        "llm.retry.base_delay_s=0.05",
        "llm.retry.max_delay_s=0.2",
        "llm.timeout_s=20",
        "amplify.target=12",
        "seeds.limit=20",
        "ray.actors=1",
        "amplify.max_cost_usd=null",
    ]
    argv = [str(ROOT / "pipelines" / "airline.yaml"), "-o", str(out), "--no-progress"]
    for item in overrides:
        argv += ["--set", item]
    code = main(argv)
    captured = capfd.readouterr()
    assert code == 0, captured.err[-3000:]

    # Not vacuous: the key went out on every request, and the gateway echoed it back.
    assert leaky_proxy.authorizations, "no request reached the proxy"
    assert set(leaky_proxy.authorizations) == {f"Bearer {KEY}"}
    assert leaky_proxy.echoed >= 4
    manifest = json.loads((out / "manifest.json").read_text())
    t = manifest["totals"]
    assert t["failed"] > 0 and t["rejected"] > 0, "the error paths must have run"

    hits, scanned = scan_folder(out)
    assert scanned >= 5
    cache_hits = [h for h in hits if str(out / "cache") in h]
    hits = [h for h in hits if h not in cache_hits]
    hits += _hits(captured.out, "stdout") + _hits(captured.err, "stderr")
    hits += _hits(caplog.text, "log records")
    for record in caplog.records:
        hits += _hits(repr(record.__dict__), f"log record {record.name}")
    ray_hits, ray_scanned = scan_ray_logs()
    assert ray_scanned > 0, "no Ray log file found to scan"
    assert not hits + ray_hits, "\n".join(hits + ray_hits)

    # The record of the run names the variable, never its value.
    state = json.loads((out / "run.json").read_text())
    assert state["recipe"]["llm"]["endpoints"][0]["api_key_env"] == KEY_ENV
    assert not cache_hits, "the response cache must hold redacted text:\n" + "\n".join(cache_hits)
