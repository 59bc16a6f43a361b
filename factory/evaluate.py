"""Score an environment simulator on step samples: Feedback Match and Config Match.

    python -m factory.evaluate --samples PATH [--recipe RECIPE [--set K=V] | --base-url URL
        --model M] [--limit N] [--concurrency C] [--out DIR] [--with-code]

Each step sample (JSONL or Parquet, see ``factory.envsim.steps``) becomes a simulate
prompt (``factory.envsim.simulator``). An envsim run's ``data/`` and ``heldout/``
folders (alpaca rows, either layout) and EnvSimBench benchmark records are read as
they are, and asked with the prompt they carry (the row's instruction and input;
EnvSimBench's SFT layout for their records). The model's answer is scored with Feedback
Match (FM), strict Config Match (CM) and EnvSimBench's lenient Config Match,
overall and per group, per |Δ|, per argument count and per tool. A failed
prediction (the LLM call failed, or the answer is not a prediction) is a miss
on every metric and is listed with its reason; a record that is not a step
sample is listed too but scored on nothing. Writes ``evaluation.json``,
``results.jsonl`` (one line per scored sample) and ``failures.jsonl`` into
``--out`` and prints a table.

Exit codes: 0 once every sample is scored (whatever the scores), 2 for a bad
option or recipe, 3 when the samples hold no step sample at all.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from factory.core.labels import GROUPS
from factory.envs.registry import available_domains, get_plugin
from factory.envsim.simulator import (
    SampleError,
    check_sample,
    config_match,
    feedback_match,
    lenient_config_match,
    parse_prediction,
    simulation_messages,
    unknown_tool_spec,
)
from factory.errors import EXIT_INPUT, ConfigError, FactoryError
from factory.io.readers import RawRecord, iter_records

__all__ = [
    "EvalReport",
    "Predictor",
    "SampleResult",
    "Tally",
    "default_domain",
    "evaluate",
    "evaluate_async",
    "llm_predictor",
    "main",
    "simulator_facts",
    "tool_sources",
]

#: An async callable that answers one step sample with the model's raw completion text.
Predictor = Callable[[dict[str, Any]], Awaitable[str]]

EVAL_SAMPLING: dict[str, Any] = {"temperature": 0.0}


@dataclass
class SampleResult:
    """The scores of one sample; ``reason`` is set when the prediction failed."""

    id: str
    tool: str
    group: str | None
    delta_size: int
    arg_cardinality: int
    feedback_match: bool = False
    config_match: bool = False
    lenient_config_match: bool = False
    reason: str | None = None
    message: str | None = None


@dataclass
class Tally:
    """Hit counts of one slice of the samples."""

    n: int = 0
    feedback_match: int = 0
    config_match: int = 0
    lenient_config_match: int = 0
    both_match: int = 0
    lenient_only: int = 0  # lenient CM passed, strict CM failed (the gaps at work)
    strict_only: int = 0
    failed: int = 0

    def add(self, r: SampleResult) -> None:
        self.n += 1
        self.feedback_match += r.feedback_match
        self.config_match += r.config_match
        self.lenient_config_match += r.lenient_config_match
        self.both_match += r.feedback_match and r.config_match
        self.lenient_only += r.lenient_config_match and not r.config_match
        self.strict_only += r.config_match and not r.lenient_config_match
        self.failed += r.reason is not None

    def rate(self, metric: str) -> float:
        return getattr(self, metric) / self.n if self.n else 0.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = asdict(self)
        out["rates"] = {
            m: round(self.rate(m), 6)
            for m in ("feedback_match", "config_match", "lenient_config_match", "both_match")
        }
        return out


@dataclass
class EvalReport:
    """Per-sample results, input records that were not samples, and their breakdowns."""

    results: list[SampleResult] = field(default_factory=list)
    invalid: list[dict[str, Any]] = field(default_factory=list)

    def _by(self, key: Callable[[SampleResult], Any]) -> dict[Any, Tally]:
        tallies: dict[Any, Tally] = {}
        for r in self.results:
            tallies.setdefault(key(r), Tally()).add(r)
        return tallies

    @property
    def overall(self) -> Tally:
        tally = Tally()
        for r in self.results:
            tally.add(r)
        return tally

    def by_group(self) -> dict[str, Tally]:
        """Tallies in ``GROUPS`` order; samples without a group under ``"?"``."""
        found = self._by(lambda r: r.group or "?")
        order = [g for g in (*GROUPS, "?") if g in found]
        return {g: found[g] for g in order}

    def by_delta_size(self) -> dict[int, Tally]:
        return dict(sorted(self._by(lambda r: r.delta_size).items()))

    def by_arg_cardinality(self) -> dict[int, Tally]:
        return dict(sorted(self._by(lambda r: r.arg_cardinality).items()))

    def by_tool(self) -> dict[str, Tally]:
        return dict(sorted(self._by(lambda r: r.tool).items()))

    def failures(self) -> list[dict[str, Any]]:
        """Failed predictions, then invalid input records: ``{id, stage, reason, message}``."""
        failed = [
            {"id": r.id, "stage": "predict", "reason": r.reason, "message": r.message}
            for r in self.results
            if r.reason is not None
        ]
        return failed + [{**row, "stage": "input"} for row in self.invalid]

    def to_dict(self) -> dict[str, Any]:
        def table(tallies: Mapping[Any, Tally]) -> dict[str, Any]:
            return {str(k): t.to_dict() for k, t in tallies.items()}

        return {
            "samples": len(self.results),
            "failed_predictions": sum(r.reason is not None for r in self.results),
            "invalid_records": len(self.invalid),
            "overall": self.overall.to_dict(),
            "by_group": table(self.by_group()),
            "by_delta_size": table(self.by_delta_size()),
            "by_arg_cardinality": table(self.by_arg_cardinality()),
            "by_tool": table(self.by_tool()),
        }

    def table(self) -> str:
        """The text report: one row per slice with n, FM, CM and lenient CM in percent."""
        head = (
            f"simulator evaluation: {len(self.results)} samples, "
            f"{self.overall.failed} failed predictions, {len(self.invalid)} invalid records"
        )
        width = max([len("overall"), *(len(f"tool {r.tool}") for r in self.results)]) + 2
        lines = [head, f"{'':{width}}{'n':>6}{'FM':>9}{'CM':>9}{'CM lenient':>12}{'FM&CM':>9}"]

        def row(label: str, t: Tally) -> str:
            pct = [
                f"{100 * t.rate(m):.1f}%"
                for m in ("feedback_match", "config_match", "lenient_config_match", "both_match")
            ]
            return f"{label:{width}}{t.n:>6}{pct[0]:>9}{pct[1]:>9}{pct[2]:>12}{pct[3]:>9}"

        lines.append(row("overall", self.overall))
        sections: list[tuple[str, Mapping[Any, Tally]]] = [
            ("group", self.by_group()),
            ("|Δ|", self.by_delta_size()),
            ("args", self.by_arg_cardinality()),
            ("tool", self.by_tool()),
        ]
        for title, tallies in sections:
            lines += [row(f"{title} {key}", t) for key, t in tallies.items()]
        return "\n".join(lines)


# --- scoring ---------------------------------------------------------------------------------


def _unscored(sample: dict[str, Any]) -> SampleResult:
    labels = sample["labels"]
    return SampleResult(
        id=str(sample["id"]),
        tool=sample["tool"],
        group=labels.get("group"),
        delta_size=int(labels.get("delta_size", len(sample["delta"]))),
        arg_cardinality=int(labels.get("arg_cardinality", len(sample["arguments"]))),
    )


def _score(sample: dict[str, Any], text: str) -> SampleResult:
    result = _unscored(sample)
    try:
        pred = parse_prediction(text)
    except FactoryError as exc:
        result.reason, result.message = exc.reason, exc.describe()
        return result
    result.feedback_match = feedback_match(pred["feedback"], sample["observation"])
    ops = pred["config_changes"]
    result.config_match = config_match(ops, sample["state_before"], sample["state_after"])
    result.lenient_config_match = lenient_config_match(
        ops, sample["state_before"], sample["state_after"]
    )
    return result


def _prepared(items: Iterable[Any], invalid: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Valid samples with an ``id``; everything else goes to ``invalid``."""
    for index, item in enumerate(items):
        where = f"#{index}"
        record: Any = item
        if isinstance(item, RawRecord):
            where = f"{item.source}:{item.index}"
            if item.error is not None:
                error = item.error
                invalid.append({"id": where, "reason": error.reason, "message": str(error)})
                continue
            record = item.record
        try:
            sample = check_sample(record)
        except SampleError as exc:
            sample_id = record.get("id") if isinstance(record, Mapping) else None
            invalid.append(
                {"id": str(sample_id or where), "reason": exc.reason, "message": str(exc)}
            )
            continue
        sample.setdefault("id", where)
        if sample["id"] is None:
            sample["id"] = where
        yield sample


async def evaluate_async(
    samples: Iterable[Any], predict: Predictor, *, concurrency: int = 8
) -> EvalReport:
    """Ask ``predict`` for every sample, at most ``concurrency`` at once, and score the answers.

    Args:
        samples: step-sample dicts (or ``RawRecord``s from ``factory.io.readers``); read lazily.
        predict: returns the model's completion text for one checked sample; a
            ``FactoryError`` it raises (``LLMError``, ``RepairError``) is a failed
            prediction with that error's reason. Other exceptions are bugs and propagate.
        concurrency: predictions in flight at most.

    Returns:
        The report; results are in input order.

    Raises:
        ConfigError: ``concurrency`` is below 1.
    """
    if concurrency < 1:
        raise ConfigError(f"must be at least 1, got {concurrency}", key_path="--concurrency")
    report = EvalReport()
    queue = enumerate(_prepared(samples, report.invalid))
    scored: dict[int, SampleResult] = {}

    async def worker() -> None:
        for index, sample in queue:  # a shared iterator: each sample goes to one worker
            try:
                text = await predict(sample)
            except FactoryError as exc:
                result = _unscored(sample)
                result.reason, result.message = exc.reason, exc.describe()
            else:
                result = _score(sample, text)
            scored[index] = result

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    report.results = [scored[i] for i in sorted(scored)]
    return report


def evaluate(samples: Iterable[Any], predict: Predictor, *, concurrency: int = 8) -> EvalReport:
    """:func:`evaluate_async` on a new event loop (for callers without one)."""
    return asyncio.run(evaluate_async(samples, predict, concurrency=concurrency))


# --- the LLM predictor -----------------------------------------------------------------------


def tool_sources(domain: str) -> dict[str, str]:
    """Source code of each tool of an executable domain (for ``--with-code``).

    Raises:
        ConfigError: the domain is unknown or its plug-in has no tool functions.
    """
    functions = get_plugin(domain, needs="tool_functions").tool_functions
    assert functions is not None
    return {name: inspect.getsource(fn) for name, fn in functions().items()}


def simulator_facts(domain: str | None, tools: Iterable[str]) -> dict[str, str]:
    """Tool name -> the registered domain's simulator facts for it (shown in its prompts)."""
    if not domain or domain not in available_domains():
        return {}
    facts = get_plugin(domain).simulator_facts
    return {name: facts(name) for name in tools} if facts is not None else {}


def job_domain(samples: str) -> str | None:
    """The domain of the job that wrote ``samples`` (its ``data/``, ``heldout/`` or
    ``candidates/`` folder, or a file in one): ``run.json`` beside those folders names
    the recipe. None for samples outside a job's output folder."""
    path = Path(samples)
    for folder in (path, *path.parents[:2]):
        run = folder / "run.json"
        if run.is_file():
            try:
                name = json.loads(run.read_text(encoding="utf-8"))["recipe"]["domain"]["name"]
            except (OSError, ValueError, KeyError, TypeError):
                return None
            return name if isinstance(name, str) else None
    return None


def default_domain(name: str | None = None, samples: str | None = None) -> str:
    """``name``, else the domain of the job that wrote ``samples``, else the only
    registered domain shipping a data pack.

    Raises:
        ConfigError: none of these, or several domains (the message lists them).
    """
    if name:
        return name
    from_job = job_domain(samples) if samples else None
    if from_job:
        return from_job
    names = available_domains("pack")
    if len(names) != 1:
        raise ConfigError(
            f"give --domain (or --recipe); domains with a data pack: {', '.join(names) or 'none'}",
            key_path="--domain",
        )
    return names[0]


def _pack_tools(domain: str) -> Path:
    pack = get_plugin(domain, needs="pack").pack
    assert pack is not None
    return pack.tools


def llm_predictor(
    client: Any,
    tools: Sequence[Mapping[str, Any]],
    *,
    code: Mapping[str, str] | None = None,
    facts: Mapping[str, str] | None = None,
) -> Predictor:
    """A predictor that asks ``client`` (an ``LLMClient``) to simulate each sample.

    Args:
        client: has ``model`` and ``async complete(request)``.
        tools: function specs; a called tool missing from them gets
            :func:`factory.envsim.simulator.unknown_tool_spec`.
        code: tool name -> source shown in the prompt.
        facts: tool name -> the domain's simulator facts (current time, new ids) for it.
    """
    from factory.engine.stages.llm_stage import request_id
    from factory.llm.types import Request

    specs = {t["name"]: t for t in tools}

    async def predict(sample: dict[str, Any]) -> str:
        name = sample["tool"]
        spec = specs.get(name) or unknown_tool_spec(name)
        # A row of a training layout carries the prompt it was trained with; ask that.
        messages = sample.get("prompt") or simulation_messages(
            sample, spec, (code or {}).get(name), (facts or {}).get(name)
        )
        rid = request_id("simulate", client.model, EVAL_SAMPLING, messages, sample=sample["id"])
        completion = await client.complete(Request.of(rid, messages))
        return str(completion.text)

    return predict


# --- CLI -------------------------------------------------------------------------------------


def _load_tools(path: Path) -> list[dict[str, Any]]:
    try:
        tools = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", key_path="--tools") from exc
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}", key_path="--tools") from exc
    if not isinstance(tools, list) or not all(
        isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools
    ):
        raise ConfigError(f"{path} must hold a list of function specs", key_path="--tools")
    return tools


def _client_and_tools(args: argparse.Namespace) -> tuple[Any, list[dict[str, Any]]]:
    from factory.llm import Endpoint, EndpointPool, LLMClient, RetryPolicy
    from factory.llm.backends.openai import sdk_transport

    if args.recipe:
        import dataclasses

        from factory.engine.settings import llm_stages
        from factory.engine.stages.llm_stage import build_client
        from factory.envs.pack import load_domain
        from factory.recipe import load_recipe, resolve_recipe_path

        cfg = load_recipe(resolve_recipe_path(args.recipe), list(args.overrides))
        if cfg.llm is None:
            raise ConfigError("the recipe has no llm section", key_path="llm")
        model = args.model or cfg.llm.model
        tools = _load_tools(Path(args.tools)) if args.tools else load_domain(cfg.domain).tools
        args.domain = cfg.domain.name
        settings = dataclasses.replace(llm_stages(cfg)["amplify"], model=model)
        return build_client(settings), tools
    if args.overrides:
        raise ConfigError("--set needs --recipe", key_path="--set")
    if not args.base_url or not args.model:
        raise ConfigError("give --recipe, or --base-url and --model", key_path="--base-url")
    pool = EndpointPool([Endpoint(base_url=args.base_url, api_key_env=args.api_key_env)])
    client = LLMClient(
        pool,
        args.model,
        EVAL_SAMPLING,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        retry=RetryPolicy(max_attempts=args.max_attempts),
        price=None,
        client_factory=sdk_transport,
    )
    args.domain = default_domain(args.domain, args.samples)
    return client, _load_tools(Path(args.tools) if args.tools else _pack_tools(args.domain))


def _limited(items: Iterable[Any], limit: int | None) -> Iterator[Any]:
    """The first ``limit`` records that are not read errors (errors pass through)."""
    taken = 0
    for item in items:
        if limit is not None and taken >= limit:
            return
        yield item
        taken += not (isinstance(item, RawRecord) and item.error is not None)


async def _run(args: argparse.Namespace) -> tuple[EvalReport, str]:
    client, tools = _client_and_tools(args)
    code = tool_sources(args.domain) if args.with_code else None
    samples = _limited(iter_records(args.samples), args.limit)
    facts = simulator_facts(args.domain, [t["name"] for t in tools])
    async with client:
        predict = llm_predictor(client, tools, code=code, facts=facts)
        report = await evaluate_async(samples, predict, concurrency=args.concurrency)
    return report, str(client.model)


def _write(report: EvalReport, out: Path, meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    body = {**meta, **report.to_dict()}
    (out / "evaluation.json").write_text(
        json.dumps(body, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    with (out / "results.jsonl").open("w", encoding="utf-8") as f:
        for r in report.results:
            f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")
    with (out / "failures.jsonl").open("w", encoding="utf-8") as f:
        for row in report.failures():
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m factory.evaluate",
        description="Score an environment simulator (FM, strict CM, lenient CM) on step samples.",
    )
    p.add_argument("--samples", required=True, help="JSONL or Parquet file/folder/glob")
    p.add_argument("--recipe", help="recipe whose llm section (and domain tools) to use")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a recipe value (YAML-parsed); repeatable",
    )
    p.add_argument("--base-url", help="OpenAI-compatible URL ending in /v1 (instead of --recipe)")
    p.add_argument("--model", help="model id (default with --recipe: llm.model)")
    p.add_argument("--api-key-env", help="environment variable holding the key of --base-url")
    p.add_argument(
        "--domain", help="domain of the samples (default: the recipe's, or the only one)"
    )
    p.add_argument("--tools", help="tool specs JSON (default: the recipe's, or the domain's pack)")
    p.add_argument("--limit", type=int, help="use at most N records (unreadable lines aside)")
    p.add_argument("--concurrency", type=int, default=8, help="predictions in flight")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request attempt")
    p.add_argument("--max-attempts", type=int, default=4, help="attempts per request")
    p.add_argument("--out", default="evaluation", help="folder for the report files")
    p.add_argument("--with-code", action="store_true", help="show each tool's source code")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.limit is not None and args.limit < 1:
            raise ConfigError("must be at least 1", key_path="--limit")
        report, model = asyncio.run(_run(args))
    except FactoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    meta = {
        "samples_path": str(args.samples),
        "model": model,
        "recipe": args.recipe,
        "with_code": bool(args.with_code),
    }
    _write(report, Path(args.out), meta)
    print(report.table())
    if not report.results:
        print("error: no step sample to score", file=sys.stderr)
        return EXIT_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
