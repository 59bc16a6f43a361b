"""Run one engine command so that it cannot outlive the Ray actor that started it.

``python -m factory.engine.serveguard --parent PID -- vllm serve ...``

Why a process between the actor and the engine: a Ray worker that is killed (``ray.kill``,
its owner, the driver, SIGKILLed, the raylet gone) gets no chance to clean up, and
``vllm serve`` is a tree of processes (API server, engine core, one worker per GPU) that
would keep its GPUs and its port. The guard is started in a session of its own by the
actor; the engine runs in a process group of its own. Every ``POLL_S`` the guard checks
that its parent is still the actor (``os.getppid()`` changes when the parent dies) and
then ends the whole group: SIGTERM (vLLM shuts its workers down), SIGKILL after
``GRACE_S``. SIGTERM to the guard does the same. The engine's direct child gets
``PR_SET_PDEATHSIG`` so that even a SIGKILLed guard takes it down.

Standard library only: it runs before anything of the factory needs importing.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

__all__ = ["main", "stop_group"]

POLL_S = 0.2
GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1


def _engine_preexec() -> None:  # pragma: no cover - runs in the child after fork
    os.setpgid(0, 0)  # a group of its own: the guard ends it without ending itself
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the group kill stays
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def stop_group(pgid: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM the process group ``pgid``, SIGKILL what is left after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> int:
    """Start the engine, watch the parent, end the engine's group; returns the engine's
    exit code (128 + N when signal N killed it; 0 when the guard stopped it)."""
    p = argparse.ArgumentParser(prog="python -m factory.engine.serveguard")
    p.add_argument("--parent", type=int, required=True, help="pid of the actor")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the engine command")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no engine command after --")
    if os.getppid() != args.parent:  # the actor died before we got here
        return 1
    stopping = False

    def _on_term(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    engine = subprocess.Popen(command, preexec_fn=_engine_preexec)
    while True:
        code = engine.poll()
        if code is not None:
            stop_group(engine.pid, grace_s=2.0)  # what the engine left behind (its workers)
            return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell
        if stopping or os.getppid() != args.parent:
            stop_group(engine.pid)
            engine.wait()
            return 0
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
