"""What a person sees in the terminal: one progress bar, factory messages, one-line errors.

Why a module of its own: a run's console used to carry Ray's start-up and
shutdown lines, the C++ core's warnings, every worker's log lines and retry
messages, a bar whose ETA came from the minutes before the first completion and
whose token count added cached tokens twice, and Ray's worker tracebacks for
errors the factory had already explained. Here:

* ``quiet_ray(out_dir)``: during a run everything written to the process's
  standard error (file descriptor 2: Ray's Python loggers, its C++ logs, the
  worker lines it forwards, warnings) goes to ``OUT/logs/run.log``; the console
  keeps the factory's own messages (``factory.*`` loggers at WARNING) and the bar.
  ``end_own_ray()`` shuts down, inside the block, the Ray session the block
  started (the runner writes the report meanwhile).
* ``ProgressBar``: tqdm with an ETA from the completion rate of the current
  phase, shown only once enough rows have completed.
* ``expected_error``: a ``FactoryError`` raised inside a Ray task or actor,
  recovered from Ray's wrapper so the CLI prints its one line.
* ``run_clock``: one start time for the printed wall time and the manifest's.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from factory import errors
from factory.errors import FactoryError

__all__ = [
    "LOG_FILE",
    "Bars",
    "PhaseRate",
    "ProgressBar",
    "console",
    "end_own_ray",
    "expected_error",
    "plain_line",
    "process_start_time",
    "quiet_ray",
    "run_clock",
    "setup_logging",
    "start_run_clock",
    "top_reasons",
]

LOG_FILE = Path("logs") / "run.log"  # under the output folder
_CONSOLE_FORMAT = "%(levelname)s %(name)s: %(message)s"
_FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Terminal control sequences (CSI: colours, cursor moves, line erases), as Ray colours the
# ``(WorkerActor pid=...)`` prefix of every worker line it forwards.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")

_console: IO[str] | None = None  # set while quiet_ray redirects standard error
_ray_was_running = True  # inside quiet_ray: was a Ray session up when the block began?
_clock: tuple[float, str] | None = None


# --- the run's clock ---------------------------------------------------------------------


def process_start_time() -> float:
    """When this process started (epoch seconds): what a person timing the command sees."""
    import psutil

    return float(psutil.Process().create_time())


def start_run_clock(started: float | None = None, *, label: str = "run() call") -> None:
    """Fix the start of the run's wall time (``started``, default now) and name it."""
    global _clock
    _clock = (time.time() if started is None else started, label)


def run_clock() -> tuple[float, str]:
    """``(start, label)`` of the current run's wall time; now, when no run set it."""
    return _clock if _clock is not None else (time.time(), "run() call")


# --- console and log ---------------------------------------------------------------------


def console() -> IO[str]:
    """The terminal's standard error, also while ``quiet_ray`` sends fd 2 to the log."""
    return _console if _console is not None else sys.stderr


class _ConsoleHandler(logging.StreamHandler):
    """Writes to ``console()`` as it is at each record (like ``logging.lastResort``)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return console()

    @stream.setter
    def stream(self, value: IO[str]) -> None:  # StreamHandler.__init__ assigns it
        pass


def _factory_only(record: logging.LogRecord) -> bool:
    return record.name == "factory" or record.name.startswith("factory.")


def setup_logging() -> None:
    """Root logger at INFO; the console shows ``factory.*`` records of WARNING and above.

    Other libraries' records (Ray's, the HTTP client's) reach only the run log.
    Idempotent: a second call keeps one console handler.
    """
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    if not any(isinstance(h, _ConsoleHandler) for h in root.handlers):
        handler = _ConsoleHandler()
        handler.setLevel(logging.WARNING)
        handler.addFilter(_factory_only)
        handler.setFormatter(logging.Formatter(_CONSOLE_FORMAT))
        root.addHandler(handler)
    logging.captureWarnings(True)  # Python warnings become log records (not console lines)
    from factory.secrets import install_log_redaction

    install_log_redaction()


@contextlib.contextmanager
def quiet_ray(out_dir: Path) -> Iterator[Path]:
    """Send this process's standard error to ``out_dir/logs/run.log`` for the block.

    File descriptor 2 is pointed at the log, so whatever Ray writes there (its
    loggers, the C++ core's lines, forwarded worker logs and tracebacks,
    warnings) is kept but off the console; ``console()`` still reaches the
    terminal. The root logger also writes every record at INFO to the log.
    A Ray session started inside the block is shut down before it ends, so its
    shutdown lines land in the log too. Yields the log's path.
    """
    global _console, _ray_was_running
    log_path = Path(out_dir) / LOG_FILE
    log_path.parent.mkdir(parents=True, exist_ok=True)
    saved_fd = os.dup(2)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    previous_stderr, previous_console = sys.stderr, _console
    stderr_is_fd2 = _fileno(previous_stderr) == 2
    # The terminal stays reachable: a new stream on a copy of the old fd 2, or the
    # current sys.stderr when that is not fd 2 (a test's capture, a notebook).
    term: IO[str] | None = None
    if stderr_is_fd2:
        term = open(os.dup(saved_fd), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115 (closed when the block ends)
    _console = term or previous_console or previous_stderr
    file_handler = logging.FileHandler(log_path, encoding="utf-8")
    file_handler.setLevel(logging.INFO)
    file_handler.setFormatter(logging.Formatter(_FILE_FORMAT))
    from factory.secrets import install_log_redaction

    root = logging.getLogger()
    root.addHandler(file_handler)
    install_log_redaction()
    previous_ray, _ray_was_running = _ray_was_running, _ray_running()
    sys.stderr.flush()
    os.dup2(log_fd, 2)
    # Kept by name: whatever replaces sys.stderr during the block, this stream is closed.
    ours = _Uncoloured(os.fdopen(os.dup(log_fd), "wb"), encoding="utf-8", errors="replace")
    sys.stderr = ours
    logging.getLogger("factory").info("run started (pid %d); log %s", os.getpid(), log_path)
    try:
        yield log_path
    finally:
        try:
            end_own_ray()
        finally:
            _ray_was_running = previous_ray
            if sys.stderr is not ours:
                with contextlib.suppress(Exception):
                    sys.stderr.flush()
            ours.flush()
            ours.close()
            sys.stderr = previous_stderr
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            os.close(log_fd)
            root.removeHandler(file_handler)
            file_handler.close()
            _console = previous_console
            if term is not None:
                term.close()


class _Uncoloured(io.TextIOWrapper):
    """A line-buffered text stream that drops terminal control sequences.

    Why: Ray forwards every worker line to the driver's ``sys.stderr`` with its
    ``(WorkerActor pid=...)`` prefix in colour; in ``OUT/logs/run.log`` those codes are
    noise to a pager, an editor or ``grep`` (issue 39). The terminal keeps its colours:
    only the log's stream strips them.
    """

    def __init__(self, buffer: IO[bytes], *, encoding: str, errors: str) -> None:
        super().__init__(buffer, encoding=encoding, errors=errors, line_buffering=True)

    def write(self, text: str) -> int:
        super().write(_ANSI.sub("", text))
        return len(text)


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None


def end_own_ray() -> None:
    """Inside ``quiet_ray``: shut down the Ray session the block started, if one is up
    (its shutdown lines go to the log); a session that was up before the block (a
    test's, a notebook's) is left alone. Outside a block: nothing."""
    if _console is not None and not _ray_was_running and _ray_running():
        _log_ray_dir()
        from factory.engine.raycompat import shutdown_ray

        shutdown_ray()


def _ray_running() -> bool:
    mod = sys.modules.get("ray")
    return bool(mod is not None and mod.is_initialized())


def _log_ray_dir() -> None:
    """Name Ray's own log folder (worker stdout/stderr files) in the run log."""
    try:
        import ray

        node: Any = ray._private.worker._global_node
        logs = node.get_logs_dir_path()
    except Exception:  # informational only: an odd Ray state must not fail the run
        logs = None
    if logs:
        logging.getLogger("factory").info("Ray's own logs: %s", logs)


# --- the progress bar --------------------------------------------------------------------


class PhaseRate:
    """Completion rate of the current phase, counted from its first completion.

    Why not tqdm's: its rate counts from when the bar was created, so the minutes
    of actor start-up before the first completion made the first ETA read hours.
    Rows arriving within ``burst_s`` of the phase's first completion count as
    that first arrival (for results that come in batches). No rate until
    ``min_rows`` more rows completed over at least ``min_seconds``.
    """

    def __init__(self, *, min_rows: int = 10, min_seconds: float = 1.0, burst_s: float = 0.0):
        self.min_rows, self.min_seconds, self.burst_s = min_rows, min_seconds, burst_s
        self.new_phase(0)

    def new_phase(self, done: int) -> None:
        """Start a phase (a new round of calls) with ``done`` rows completed so far."""
        self.base = done
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None

    def observe(self, done: int, now: float) -> None:
        if self.first is None:
            if done > self.base:
                self.first = (now, done)
        elif now - self.first[0] < self.burst_s:
            self.first = (self.first[0], max(self.first[1], done))
        self.last = (now, done)

    def rate(self, now: float) -> float | None:
        """Rows per second since the phase's first completion, or None (not enough yet)."""
        if self.first is None or self.last is None:
            return None
        rows = self.last[1] - self.first[1]
        seconds = now - self.first[0]
        if rows < self.min_rows or seconds < self.min_seconds:
            return None
        return rows / seconds

    def eta_s(self, remaining: int, now: float) -> float | None:
        rate = self.rate(now)
        return remaining / rate if rate else None


class ProgressBar(tqdm):
    """tqdm on the console with the ETA and rate of ``PhaseRate`` ('?' until known)."""

    BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{phase_eta}, {phase_rate}{postfix}]"

    def __init__(self, *args: Any, **kwargs: Any):
        self.phase_rate = PhaseRate()
        kwargs.setdefault("file", console())
        if kwargs.get("total"):
            kwargs.setdefault("bar_format", self.BAR_FORMAT)
        super().__init__(*args, **kwargs)

    def new_phase(self) -> None:
        """A new round starts: its rate counts from its own first completion."""
        self.phase_rate.new_phase(int(self.n))

    def update(self, n: float | None = 1) -> bool | None:
        done = super().update(n)
        self.phase_rate.observe(int(self.n), time.monotonic())
        return done

    @property
    def format_dict(self) -> dict[str, Any]:
        d = super().format_dict
        if not d.get("ncols"):  # a terminal of unknown width: tqdm would drop our format
            d["ncols"] = None
        now = time.monotonic()
        self.phase_rate.observe(int(self.n), now)  # also when a caller set .n directly
        rate = self.phase_rate.rate(now)
        total = self.total or 0
        eta = self.phase_rate.eta_s(max(int(total - self.n), 0), now) if total else None
        d["phase_eta"] = tqdm.format_interval(eta) if eta is not None else "?"
        d["phase_rate"] = f"{rate:.2f}{self.unit}/s" if rate else f"?{self.unit}/s"
        return d


class Bars:
    """The run's progress lines, one ``ProgressBar`` per name (``factory.engine.loop.Bar``),
    each on its own line, in the order they first appear (seed check, judge, calls).

    Without a terminal (``ray job submit``, a log file) redrawn bars would be a wall of
    escape codes: each bar is printed as one plain line instead, when it starts, every
    ``every_s`` seconds while it moves, and when it is done.
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        unit: str = "row",
        every_s: float = 10.0,
        tty: bool | None = None,
    ) -> None:
        self.enabled = enabled
        self.unit = unit
        self.every_s = every_s
        self.tty = _isatty(console()) if tty is None else tty
        self._bars: dict[str, ProgressBar] = {}
        self._printed: dict[str, tuple[float, tuple[Any, ...]]] = {}
        self._rates: dict[str, PhaseRate] = {}

    def show(self, bars: Any) -> None:
        if not self.enabled:
            return
        if not self.tty:
            self._lines(bars)
            return
        for bar in bars:
            pb = self._bars.get(bar.name)
            if pb is None:
                pb = ProgressBar(
                    total=bar.total,
                    desc=bar.name,
                    unit=self.unit,
                    dynamic_ncols=True,
                    position=len(self._bars),
                    leave=True,
                    mininterval=0.2,
                )
                self._bars[bar.name] = pb
            if pb.disable:
                continue
            if bar.total != pb.total:
                pb.total = bar.total
            if bar.n != pb.n:
                pb.update(bar.n - pb.n)
            if bar.postfix:
                pb.set_postfix(bar.postfix, refresh=False)
            if bar.done or time.time() - pb.last_print_t >= 0.5:  # the clock moves, too
                pb.refresh()

    def _lines(self, bars: Any) -> None:
        now = time.time()
        for bar in bars:
            rate = self._rates.setdefault(bar.name, PhaseRate())
            rate.observe(bar.n, time.monotonic())
            state = (bar.n, bar.total, bar.done)
            last = self._printed.get(bar.name)
            changed = last is None or last[1] != state
            due = last is None or now - last[0] >= self.every_s
            if not (changed and (due or bar.done)):
                continue
            self._printed[bar.name] = (now, state)
            print(
                plain_line(bar, rate.rate(time.monotonic()), self.unit), file=console(), flush=True
            )

    def close(self) -> None:
        for pb in self._bars.values():
            pb.close()
        self._bars.clear()


def plain_line(bar: Any, rate: float | None, unit: str = "row") -> str:
    """One progress line for a log: ``accepted: 40/60 (67%), 12.5 row/s, calls=92``."""
    total = f"/{bar.total}" if bar.total else ""
    share = f" ({100 * bar.n // bar.total}%)" if bar.total else ""
    parts = [f"{bar.name}: {bar.n}{total}{share}"]
    if rate:
        parts.append(f"{rate:.1f} {unit}/s")
    if bar.postfix:
        parts.append(", ".join(f"{k}={v}" for k, v in bar.postfix.items()))
    return ", ".join(parts) + (" (done)" if bar.done else "")


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


# --- why nothing survived ----------------------------------------------------------------


def top_reasons(
    reasons: dict[str, int], examples: dict[str, tuple[str, str]], *, n: int = 5
) -> list[str]:
    """The ``n`` commonest reject reasons, one line each with one example.

    Args:
        reasons: ``{"stage:reason": count}``.
        examples: ``{"stage:reason": (source, message)}`` of the first row with it.
    """
    lines = []
    ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    for key, count in ranked[:n]:
        source, message = examples.get(key, ("?", ""))
        text = " ".join(str(message).split())
        lines.append(f"{key} x{count}, e.g. {source}: {text[:200]}")
    if len(ranked) > n:
        lines.append(f"... and {len(ranked) - n} more reasons")
    return lines


# --- errors from Ray ---------------------------------------------------------------------

_RAISED = re.compile(r"^factory\.errors\.(\w+): (.+)$", re.M)


def expected_error(exc: BaseException) -> tuple[str, int] | None:
    """``(message, exit code)`` of the ``FactoryError`` behind ``exc``, or None.

    Ray wraps an error raised in a task (``RayTaskError`` holding the cause, or
    its cause's cause) or in an actor's constructor (``ActorDiedError``, which
    keeps only the traceback text, whose last ``factory.errors.X: message``
    line names it). The message is the error's own, without Ray's traceback.
    """
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        err = todo.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, FactoryError):
            return _own_message(err), err.exit_code
        for nxt in (getattr(err, "cause", None), err.__cause__, err.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    if type(exc).__module__.split(".")[0] != "ray":
        return None
    found = _RAISED.findall(_ANSI.sub("", str(exc)))
    for name, message in reversed(found):
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, FactoryError):
            return message.strip(), cls.exit_code
    return None


def _own_message(err: FactoryError) -> str:
    """The error's message without a Ray traceback (a ``RayTaskError`` that is also an
    instance of the cause's class renders the whole remote traceback)."""
    text = _ANSI.sub("", str(err))
    found = _RAISED.findall(text)
    return found[-1][1].strip() if found and "Traceback" in text else text
