"""Fidelity of an executable world: does it reproduce recorded observations?

Why: "execute where a domain is executable" is only worth something if our
world answers exactly as the one the seeds were recorded in. The replay
starts every trajectory from a fresh copy of the database, executes each
assistant tool call in order, and compares the produced observation with the
recorded tool message: as parsed JSON (types included) when both sides parse,
after renaming keys the database has renamed since recording (the domain
plug-in's ``fidelity_renames``, e.g. airline: ``province`` -> ``state``),
else as exact strings.

    python -m factory.fidelity --domain airline --db DIR --trajectories FILE \\
        [--mismatches OUT.jsonl]

prints ``matched/total`` and exits 0 only when every observation matched.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from factory.core.delta import same_json
from factory.core.trajectory import Trajectory
from factory.envs.base import Environment, error_observation
from factory.envs.registry import get_environment, get_plugin
from factory.errors import ConfigError, FactoryError, SeedFormatError, short

__all__ = [
    "FidelityReport",
    "Mismatch",
    "load_trajectories",
    "main",
    "observations_match",
    "replay_fidelity",
]

_NOT_JSON = object()


@dataclass
class Mismatch:
    """One observation the world did not reproduce."""

    trajectory: int
    task_id: Any
    step: int
    call: dict[str, Any]
    expected: str | None
    got: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FidelityReport:
    """Counts over every recorded observation; ``per_tool`` maps name -> [matched, total]."""

    trajectories: int = 0
    total: int = 0
    matched: int = 0
    unanswered: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    per_tool: dict[str, list[int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every observation matched, and there was at least one."""
        return self.total > 0 and self.matched == self.total

    def summary(self) -> str:
        text = f"{self.matched}/{self.total} observations match ({self.trajectories} trajectories)"
        if self.unanswered:
            text += f"; {self.unanswered} calls had no recorded observation"
        return text

    def add(self, tool: str, matched: bool) -> None:
        """Count one compared observation."""
        counts = self.per_tool.setdefault(tool, [0, 0])
        counts[0] += matched
        counts[1] += 1
        self.total += 1
        self.matched += matched


# --- comparison ----------------------------------------------------------------------------


def _parse(text: Any) -> Any:
    if not isinstance(text, str):
        return _NOT_JSON
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON


def _rename(value: Any, renames: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {renames.get(k, k): _rename(v, renames) for k, v in value.items()}
    if isinstance(value, list):
        return [_rename(v, renames) for v in value]
    return value


def observations_match(
    expected: str | None, got: str | None, renames: Mapping[str, str] | None = None
) -> bool:
    """Recorded vs produced observation: parsed JSON when both parse, else exact text."""
    want, have = _parse(expected), _parse(got)
    if want is _NOT_JSON or have is _NOT_JSON:
        return expected == got
    return same_json(_rename(want, renames or {}), have)


# --- reading records ------------------------------------------------------------------------


def _events(record: Any) -> Iterator[tuple[str, Any, Any, Any]]:
    """("call", id, name, arguments) and ("observation", tool_call_id, name, content), in order.

    Accepts tau-bench records (``traj``), OpenAI-style ``messages`` and canonical
    ``Trajectory`` objects. Arguments stay strings when recorded as strings.
    """
    if isinstance(record, Trajectory):
        for turn in record.turns:
            for call in turn.tool_calls:
                yield "call", call.id, call.name, call.arguments
            if turn.role == "tool":
                yield "observation", turn.tool_call_id, turn.name, turn.content
        return
    messages = record.get("traj") or record.get("messages") or []
    for message in messages:
        if not isinstance(message, dict):
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") or call
            yield "call", call.get("id"), function.get("name"), function.get("arguments")
        if message.get("role") == "tool":
            yield (
                "observation",
                message.get("tool_call_id"),
                message.get("name"),
                message.get("content"),
            )


def _run_call(env: Environment, name: Any, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return error_observation(f"arguments are not valid JSON: {exc}")
    return env.execute(str(name), arguments if arguments is not None else {})


def _task_id(record: Any) -> Any:
    if isinstance(record, Trajectory):
        return record.metadata.get("task_id")
    return record.get("task_id")


def replay_fidelity(
    env_factory: Callable[[], Environment],
    trajectories: Iterable[Mapping[str, Any] | Trajectory],
    *,
    renames: Mapping[str, str] | None = None,
) -> FidelityReport:
    """Re-execute every recorded tool call and compare observations.

    Args:
        env_factory: returns a fresh world per trajectory (e.g. ``base.copy``).
        trajectories: tau-bench records, ``{"messages": [...]}`` dicts, or
            canonical trajectories.
        renames: keys to rename in recorded JSON before comparing.

    Returns:
        The counts and every mismatch. A tool message answering no call counts
        as a mismatch with ``got=None``; a call without a recorded answer is
        counted in ``unanswered`` only.
    """
    report = FidelityReport()
    for index, record in enumerate(trajectories):
        report.trajectories += 1
        env = env_factory()
        pending: dict[Any, tuple[int, dict[str, Any], str]] = {}
        step = 0
        for kind, ref, name, payload in _events(record):
            if kind == "call":
                got = _run_call(env, name, payload)
                key = ref if ref is not None else ("#", step)
                pending[key] = (step, {"name": name, "arguments": payload}, got)
                step += 1
                continue
            key = ref if ref in pending else next(iter(pending), None)
            if key is None:
                call: dict[str, Any] = {"name": name, "arguments": None}
                report.add(str(name), False)
                report.mismatches.append(Mismatch(index, _task_id(record), -1, call, payload, None))
                continue
            at, call, got = pending.pop(key)
            matched = observations_match(payload, got, renames)
            report.add(str(call["name"]), matched)
            if not matched:
                report.mismatches.append(Mismatch(index, _task_id(record), at, call, payload, got))
        report.unanswered += len(pending)
    return report


def load_trajectories(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSON list file or a JSONL file.

    Raises:
        SeedFormatError: unreadable file, invalid JSON, or records that are not objects.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SeedFormatError("unreadable_bytes", f"cannot read {file}: {exc}") from exc
    try:
        if text.lstrip().startswith("["):
            records = json.loads(text)
        else:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as exc:
        raise SeedFormatError("invalid_json", f"{file} is not JSON or JSONL: {exc}") from exc
    if not all(isinstance(r, dict) for r in records):
        raise SeedFormatError("not_an_object", f"{file}: every record must be a JSON object")
    return records


# --- CLI -------------------------------------------------------------------------------------


def _parse_renames(pairs: Sequence[str]) -> dict[str, str]:
    renames = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        if not sep or not old or not new:
            raise ConfigError(f"takes OLD=NEW, got {short(pair)}", key_path="--rename")
        renames[old] = new
    return renames


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m factory.fidelity",
        description="Replay recorded tool calls in an executable world and compare observations.",
    )
    parser.add_argument("--domain", required=True, help="executable domain (plug-in)")
    parser.add_argument("--db", required=True, help="folder with the domain's database files")
    parser.add_argument("--trajectories", required=True, help="JSON list or JSONL of records")
    parser.add_argument("--mismatches", help="write each mismatch as a JSON line here")
    parser.add_argument(
        "--rename",
        action="append",
        default=None,
        metavar="OLD=NEW",
        help="rename a key in recorded JSON (default: the domain's known renames)",
    )
    args = parser.parse_args(argv)
    try:
        renames = (
            _parse_renames(args.rename)
            if args.rename is not None
            else dict(get_plugin(args.domain).fidelity_renames)
        )
        base = get_environment(args.domain, db_dir=args.db)
        report = replay_fidelity(base.copy, load_trajectories(args.trajectories), renames=renames)
    except FactoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(report.summary())
    for tool, (ok, total) in sorted(report.per_tool.items()):
        if ok != total:
            print(f"  {tool}: {ok}/{total}")
    if args.mismatches:
        with open(args.mismatches, "w", encoding="utf-8") as out:
            for mismatch in report.mismatches:
                out.write(json.dumps(mismatch.to_dict(), ensure_ascii=False) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
