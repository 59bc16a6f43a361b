"""``llm.serve`` with a mixed recipe (issue 34): every part's calls go to the run's own pool.

The development server is the served engine and ``fake_gpu`` (Ray's resource override in
the driver's environment) stands in for the GPU, as in ``tests/engine/test_serve.py``; the
run is the CLI in a process of its own, so its private Ray has that resource.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers import cli_args, free_port, read_rows

pytestmark = pytest.mark.slow


ENDPOINTS = """  endpoints:
    - base_url: https://api.openai.com/v1
      api_key_env: OPENAI_API_KEY
"""


def _engines(port: int) -> list[int]:
    """pids of development servers (not their guards) listening on ``port``."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info["cmdline"] or []
        engine = "factory.devserver" in cmd and "factory.engine.serveguard" not in cmd
        if engine and "--port" in cmd and cmd[cmd.index("--port") + 1] == str(port):
            found.append(int(proc.info["pid"]))
    return found


@pytest.mark.timeout(900)
def test_a_mixed_recipe_with_llm_serve_runs_every_part_on_its_own_pool(tmp_path: Path) -> None:
    port = free_port()
    serve = {
        "replicas": 1,
        "gpus_per_replica": 1,
        "resource": "fake_gpu",
        "cpus_per_replica": 0,
        "host": "127.0.0.1",
        "port_range": [port, port],
        "command": ["{python}", "-m", "factory.devserver", "--port", "{port}", "--seed", "4"],
        "engine_args": [],
        "startup_timeout_s": 300,
    }
    # The shipped mixed recipe without its endpoints (the pool replaces them; both at once
    # are refused), its relative paths made absolute.
    text = (ROOT / "pipelines" / "mixed.yaml").read_text(encoding="utf-8")
    text = text.replace("../", f"{ROOT}/")
    recipe = tmp_path / "mixed-served.yaml"
    recipe.write_text(text.replace(ENDPOINTS, ""), encoding="utf-8")
    out = tmp_path / "out"
    sets = [
        "llm.model=factory-dev",
        "prefilter.model=factory-dev",
        "amplify.target=10",
        "parts.0.quota=4",
        "parts.1.quota=6",
        "amplify.max_cost_usd=null",
        "llm.retry.base_delay_s=0.05",
        "llm.retry.max_delay_s=0.5",
        "llm.timeout_s=30",
        "llm.deadline.hedge_share=0",
        "ray.num_cpus=0.25",
        "llm.serve=" + json.dumps(serve),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "RAY_ADDRESS")}
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rm", dir="/tmp")
    env["RAY_OVERRIDE_RESOURCES"] = json.dumps({"fake_gpu": 1})
    # No key for the recipe's own endpoint: a part that skipped the pool fails loudly.
    env.pop("OPENAI_API_KEY", None)
    done = subprocess.run(
        cli_args(out, *sets, name=str(recipe)),
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "llm.serve: 1 replica(s) of factory-dev healthy" in done.stderr, done.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [r["url"] for r in manifest["serve"]["replicas"]] == [f"http://127.0.0.1:{port}/v1"]
    assert manifest["generated_with_devserver"] is True
    by_domain = Counter(json.loads(r["meta"])["domain"] for r in read_rows(out))
    assert by_domain == {"airline": 4, "retail": 6}
    for label in ("airline", "retail"):  # each part answered by the served engine
        part = json.loads((out / "parts" / label / "manifest.json").read_text())
        assert part["generated_with_devserver"] is True and part["calls"]["issued"] > 0
    deadline = time.monotonic() + 60
    while _engines(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _engines(port), "the served engine outlived the run"
