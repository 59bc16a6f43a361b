"""Ctrl-C and SIGTERM end a run cleanly: one line saying how to resume, exit code 130.

Python's default turns Ctrl-C into a ``KeyboardInterrupt`` traceback that runs
through Ray Data's iterator (40 lines), and the head node that a local
``ray.init()`` starts installs its own SIGTERM handler, which tears Ray down
from inside the signal and ends in a C++ abort (exit 134). Neither says that
the folder is resumable. The CLI installs ``on_signal`` for both signals
instead (``install``), ``keep_handlers`` puts it back after ``ray.init``, and
the CLI turns the resulting ``KeyboardInterrupt`` into the one line. A second
signal while the run winds down ends the process at once.

A ``KeyboardInterrupt`` rather than a ``FactoryError``: it must not be
swallowed by code that handles ``Exception`` (a stage's per-row guard, best
effort clean-ups) on its way up.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from factory.errors import EXIT_INTERRUPTED

__all__ = [
    "install",
    "keep_handlers",
    "on_signal",
    "received",
    "restore",
    "resume_command",
    "signal_name",
]

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[str] = []


def received() -> str | None:
    """The name of the signal this process received, if any: whatever error surfaces
    after it (Ray's head processes share the terminal's Ctrl-C) is the interrupt."""
    return _received[0] if _received else None


def signal_name(exc: BaseException) -> str:
    """The signal an interrupt came from (``SIGINT`` for a plain ``KeyboardInterrupt``)."""
    return str(exc.args[0]) if exc.args else "SIGINT"


def on_signal(signum: int, frame: FrameType | None) -> None:
    """First signal: raise in the main thread; later ones: exit at once."""
    name = signal.Signals(signum).name
    _received.append(name)
    for sig in SIGNALS:
        signal.signal(sig, _force_exit)
    raise KeyboardInterrupt(name)


def _force_exit(signum: int, frame: FrameType | None) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def install() -> dict[int, Any]:
    """Handle SIGINT and SIGTERM with ``on_signal`` (main thread only; else a no-op).

    Returns the handlers it replaced, for ``restore``: ``main()`` also runs inside
    other programs (tests), whose own handlers come back when it returns.
    """
    _received.clear()
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[int, Any] = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, on_signal)
    return previous


def restore(previous: dict[int, Any]) -> None:
    """Put back the handlers ``install`` replaced."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


@contextlib.contextmanager
def keep_handlers() -> Iterator[None]:
    """Around ``ray.init``: keep ``on_signal`` where it was installed (Ray's local head
    replaces the SIGTERM handler with one that aborts); other handlers are left as
    Ray sets them, so a library caller keeps Ray's behaviour."""
    main = threading.current_thread() is threading.main_thread()
    ours = [sig for sig in SIGNALS if main and signal.getsignal(sig) is on_signal]
    try:
        yield
    finally:
        for sig in ours:
            signal.signal(sig, on_signal)


def resume_command(argv: list[str]) -> str:
    """The command that resumes an interrupted ``python -m factory.run`` invocation:
    the same arguments, without ``--fresh`` (which would start over)."""
    return shlex.join(["python", "-m", "factory.run", *(a for a in argv if a != "--fresh")])
