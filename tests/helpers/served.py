"""A ``python -m factory.simenv serve`` process for tests, and one episode played against it
(the simenv serve tests and the third-party domain's)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from factory.simenv.server import SimAction, SimClient
from tests.conftest import ROOT

__all__ = ["Served", "episode_steps"]


class Served:
    """A ``python -m factory.simenv serve`` process (its own session) and its stderr lines."""

    def __init__(self, *args: str):
        cmd = [sys.executable, "-m", "factory.simenv", "serve", *args, "--devserver"]
        self.proc = subprocess.Popen(
            [*cmd, "--port", "0"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.url = self._wait_for_url(deadline=time.monotonic() + 300)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _wait_for_url(self, deadline: float) -> str:
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                self.kill()
                pytest.fail(f"serve printed no URL in 300 s: {self.lines}")
            if line is None:
                pytest.fail(f"serve exited with {self.proc.wait()}: {self.lines}")
            self.lines.append(line)
            found = re.search(r"^serving .* on (http://\S+) ", line)
            if found:
                return found.group(1)

    def stop(self) -> int:
        """SIGTERM, as a launcher ends it; the exit code once it has shut down cleanly."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=120)
        finally:
            self.kill()

    def kill(self) -> None:
        """End the process (if it still runs) and close its pipe once it is read to the end."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._reader.join(timeout=30)
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        while not self._queue.empty():
            line = self._queue.get_nowait()
            if line is not None:
                self.lines.append(line)


async def episode_steps(url: str, task_id: str, actions: list[dict[str, Any]]) -> list[Any]:
    """Reset ``task_id``, make ``actions``, end the conversation; every step's result."""
    async with SimClient(base_url=url, connect_timeout_s=300, message_timeout_s=300) as env:
        steps = [await env.reset(task_id=task_id, seed=0)]
        for a in actions:
            steps.append(await env.step(SimAction(tool_name=a["name"], arguments=a["arguments"])))
        if not steps[-1].done:
            steps.append(await env.step(SimAction(content="Everything is done.")))
    return steps
