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

The first signal lets the requests in flight finish for ``llm.stop_grace_s``
(``factory.engine.loop.wind_down``); a second one skips that wait: it ends the
process at once, and still prints how to resume (``set_resume_hint``). Once the
run's data is complete (``mark_complete``) an interrupt no longer makes the run
"interrupted": the CLI reports the finished run.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from factory.errors import EXIT_INTERRUPTED

__all__ = [
    "completed",
    "install",
    "invocation",
    "keep_handlers",
    "mark_complete",
    "on_signal",
    "received",
    "restore",
    "resume_command",
    "set_resume_hint",
    "signal_name",
]

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[str] = []
_hint: list[bytes] = []  # what a second signal prints before the process ends
_complete: list[str] = []  # the output folder whose data is complete (run.json: done)
_stderr: list[int] = []  # a copy of fd 2 as ``install`` found it (a run sends fd 2 to its log)


def set_resume_hint(command: str) -> None:
    """The command a second signal names (it ends the process from the signal handler,
    where nothing can be computed or formatted safely)."""
    _hint[:] = [
        (
            "interrupted again: stopped at once (the requests in flight are paid again by "
            f"the resume); the output folder is resumable; to continue, run the same "
            f"command: {command}\n"
        ).encode()
    ]


def mark_complete(out_dir: str) -> None:
    """The run is about to record its end: from the moment ``OUT/run.json`` says
    ``done``, an interrupt cuts only what follows (the report, Ray's shutdown)."""
    _complete[:] = [out_dir]


def completed() -> str | None:
    """The output folder this process completed (its run.json says ``done``), if any:
    an interrupt after that is not an interrupted run."""
    if not _complete:
        return None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        state = json.loads(Path(_complete[0], "run.json").read_text(encoding="utf-8"))
        if state.get("status") == "done":
            return _complete[0]
    return None


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
    """A second signal: say how to resume (one ``write`` to the terminal: the handler may
    have interrupted a ``print``, so no buffered stream is touched) and end now."""
    fd = _stderr[0] if _stderr else 2  # the terminal, also while Ray's output goes to the log
    with contextlib.suppress(OSError):
        os.write(fd, _hint[0] if _hint else b"interrupted again: stopped\n")
    os._exit(EXIT_INTERRUPTED)


def install() -> dict[int, Any]:
    """Handle SIGINT and SIGTERM with ``on_signal`` (main thread only; else a no-op).

    Returns the handlers it replaced, for ``restore``: ``main()`` also runs inside
    other programs (tests), whose own handlers come back when it returns.
    """
    _received.clear()
    _complete.clear()
    if threading.current_thread() is not threading.main_thread():
        return {}
    _close_stderr()
    with contextlib.suppress(OSError):
        _stderr.append(os.dup(2))
    previous: dict[int, Any] = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, on_signal)
    return previous


def restore(previous: dict[int, Any]) -> None:
    """Put back the handlers ``install`` replaced."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    if previous:
        _close_stderr()


def _close_stderr() -> None:
    while _stderr:
        with contextlib.suppress(OSError):
            os.close(_stderr.pop())


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


def resume_command(argv: list[str], prefix: Sequence[str] | None = None) -> str:
    """The command that resumes an interrupted run: ``prefix`` (the words the user typed
    to start it: ``invocation``; default ``python -m factory.run``) and the same
    arguments, without ``--fresh`` (which would start over)."""
    start = list(prefix) if prefix else ["python", "-m", "factory.run"]
    return shlex.join([*start, *(a for a in argv if a != "--fresh")])


def invocation(
    prog: str,
    orig_argv: Sequence[str],
    argv0: str,
    which: Callable[[str], str | None] = shutil.which,
) -> list[str]:
    """The words that started this command as the user typed them, before its arguments
    (a pure function of the process's command line: ``sys.orig_argv``, ``sys.argv[0]``).

    ``.venv/bin/python -m factory.run`` stays that (the interpreter's path as typed: a
    fresh shell has no venv active, and ``python`` there is another interpreter); the
    console script is ``factory run`` when ``factory`` on PATH is this script, else its
    path as typed. ``prog`` (``python -m factory.run`` or ``factory run``) says which
    entry point parsed the arguments, and is the answer when the command line is another
    program's (``main()`` called from a test).
    """
    words = prog.split()
    module = "factory.run" if words[:3] == ["python", "-m", "factory.run"] else "factory"
    for i, word in enumerate(orig_argv[:-1]):
        if word == "-m" and orig_argv[i + 1] == module:
            return [*orig_argv[: i + 2], *([] if module == "factory.run" else words[1:])]
    if module == "factory" and os.path.basename(argv0) == "factory":
        found = which("factory")
        same = found is not None and os.path.realpath(found) == os.path.realpath(argv0)
        return ["factory" if same else argv0, *words[1:]]
    return words
