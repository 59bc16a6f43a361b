"""``OUT/llamafactory/sft.yaml``: a LLaMA-Factory SFT config that fits the data.

Why: trained with LLaMA-Factory's defaults (``cutoff_len`` 2048), an amplified
airline row loses everything after its system prompt and tool list (about 5k
tokens before the first user turn), and 44% of envsim rows lose their end. The
config written here names the folder (``dataset_dir``, ``dataset``), a chat
template that renders tools, and a ``cutoff_len`` that covers at least 99% of the
rows (``COVERAGE``), counted as the trainer sees them: the system prompt, the tool
list as the template renders it and every turn, each message with the template's
markup (``MESSAGE_OVERHEAD``).

Tokens are counted with the tokenizer of the model the recipe names
(``output.tokenizer``: a Hugging Face name or a local folder), loaded offline with
``transformers`` when it is installed and the files are on disk: the count is exact.
Otherwise they are estimated at ``CHARS_PER_TOKEN`` characters per token; JSON, ids and
dates tokenize at 2.5-3.5 characters per token with the Qwen and Llama tokenizers
(English prose at about 4), so a row counted at 3 may really be 20% longer. The cutoff
from an estimate therefore errs long: it is taken over each row's upper bound, its
characters at ``DENSEST_CHARS_PER_TOKEN`` (``ESTIMATE_MARGIN``). Counting too many
tokens only raises the cutoff (rows are not padded to it); counting too few cuts rows
(issue 39: a row estimated at 1,255 tokens got ``cutoff_len: 1280``, a 2% margin). The
count is pure (``row_tokens``, ``cutoff_for``); loading the tokenizer is the only I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from factory.io.writer import atomic_write_text

__all__ = [
    "CHARS_PER_TOKEN",
    "COVERAGE",
    "DEFAULT_MODEL",
    "DENSEST_CHARS_PER_TOKEN",
    "ESTIMATE_MARGIN",
    "SFT_FILE",
    "Fit",
    "TokenCounter",
    "cutoff_for",
    "fit",
    "guess_template",
    "load_counter",
    "row_tokens",
    "sft_config",
    "write_sft",
]

SFT_FILE = "llamafactory/sft.yaml"
CHARS_PER_TOKEN = 3.0  # the estimate's rate without a tokenizer: JSON, ids and prose mixed
DENSEST_CHARS_PER_TOKEN = 2.5  # the densest text rows hold (JSON, ids, dates)
ESTIMATE_MARGIN = CHARS_PER_TOKEN / DENSEST_CHARS_PER_TOKEN  # an estimated row's upper bound
COVERAGE = 0.99  # rows cutoff_len keeps whole
ROUND_TO = 256  # cutoff_len is a multiple of this
MESSAGE_OVERHEAD = 8  # tokens of a message's markup (role header, end marker, tool tags)
# The template's instructions around the tool list, as LLaMA-Factory's qwen format has them.
TOOLS_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
DEFAULT_MODEL = "Qwen/Qwen3-8B"
# (words in a lower-cased model name, template, template without thinking): LLaMA-Factory
# templates whose format renders the tools column into the prompt.
_TEMPLATES = (
    (("qwen3.5", "qwen3_5", "qwen3-5"), "qwen3_5", "qwen3_5_nothink"),
    (("qwen3",), "qwen3", "qwen3_nothink"),
    (("qwen",), "qwen", "qwen"),
    (("llama-4", "llama4"), "llama4", "llama4"),
    (("llama-3", "llama3"), "llama3", "llama3"),
    (("ministral", "mistral"), "mistral", "mistral"),
    (("glm-4", "glm4"), "glm4", "glm4"),
)


@dataclass(frozen=True)
class TokenCounter:
    """Counts the tokens of a text; ``name`` says how (a tokenizer or the estimate);
    ``exact``: a tokenizer counts (else an estimate, whose cutoff keeps a margin)."""

    name: str
    count: Callable[[str], int]
    exact: bool = False


def _estimate(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def load_counter(tokenizer: str | None) -> tuple[TokenCounter, str | None]:
    """The counter for ``tokenizer`` and, when it could not be loaded, why (the estimate
    is used then). Never downloads: only files already on disk (``local_files_only``)."""
    estimate = TokenCounter(f"estimate: {CHARS_PER_TOKEN:g} characters per token", _estimate)
    if not tokenizer:
        return estimate, None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return estimate, f"transformers is not installed, so {tokenizer} was not loaded"
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    except Exception as exc:  # not cached, not a tokenizer folder, a broken file ...
        reason = " ".join(str(exc).split())[:160]
        return estimate, f"{tokenizer} could not be loaded offline ({type(exc).__name__}: {reason})"

    @lru_cache(maxsize=256)  # the system prompt and the tool list repeat on every row
    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    return TokenCounter(f"tokenizer {tokenizer}", count, exact=True), None


def _is_wrapped(spec: Any) -> bool:
    return isinstance(spec, dict) and spec.get("type") == "function"


@lru_cache(maxsize=64)  # every row of a domain carries the same tool list
def _tools_text_of(tools: str) -> str:
    return _tools_text(tools)


def _tools_text(tools: Any) -> str:
    """The tool list as the template shows it: each tool as one JSON object, wrapped as
    ``{"type": "function", "function": ...}``, inside the template's instructions."""
    try:
        specs = json.loads(tools) if isinstance(tools, str) else tools
    except ValueError:
        return str(tools)
    if not isinstance(specs, list) or not specs:
        return ""
    wrapped = [s if _is_wrapped(s) else {"type": "function", "function": s} for s in specs]
    return TOOLS_PREAMBLE + "".join("\n" + json.dumps(w, ensure_ascii=False) for w in wrapped)


def row_tokens(row: Mapping[str, Any], count: Callable[[str], int]) -> int:
    """Tokens of one row as the trainer sees it: a ShareGPT row (system, tools, turns)
    or an alpaca row (system, instruction and input as one user turn, output)."""
    n = 0
    system = str(row.get("system") or "")
    raw = row.get("tools")
    tools = (_tools_text_of(raw) if isinstance(raw, str) else _tools_text(raw)) if raw else ""
    if system or tools:
        n += count(system) + (count(tools) if tools else 0) + MESSAGE_OVERHEAD
    if "conversations" in row:
        for turn in row.get("conversations") or ():
            n += count(str(turn.get("value") or "")) + MESSAGE_OVERHEAD
        return n
    prompt = "\n".join(str(row[k]) for k in ("instruction", "input") if row.get(k))
    return n + count(prompt) + count(str(row.get("output") or "")) + 2 * MESSAGE_OVERHEAD


def cutoff_for(lengths: Sequence[int], coverage: float = COVERAGE, multiple: int = ROUND_TO) -> int:
    """The smallest multiple of ``multiple`` that at least ``coverage`` of ``lengths``
    fit in (``multiple`` for no row)."""
    if not lengths:
        return multiple
    ordered = sorted(lengths)
    kept = ordered[max(0, math.ceil(coverage * len(ordered)) - 1)]
    return max(multiple, math.ceil(kept / multiple) * multiple)


def guess_template(model: str, *, thinking: bool) -> str | None:
    """LLaMA-Factory's tool-rendering template for ``model``'s family, or None."""
    name = model.lower()
    for words, with_thinking, without in _TEMPLATES:
        if any(w in name for w in words):
            return with_thinking if thinking else without
    return None


@dataclass(frozen=True)
class Fit:
    """How the rows fit the SFT config: ``cutoff_len`` and the length distribution."""

    model: str
    template: str
    cutoff_len: int
    counted_with: str
    lengths: tuple[int, ...]
    note: str | None = None  # why the estimate was used, or the template guessed
    margin: float = 1.0  # a row may be this much longer than counted (1: counted exactly)

    @property
    def exact(self) -> bool:
        return self.margin == 1.0

    @property
    def over(self) -> int:
        """Rows that may be longer than ``cutoff_len`` (the trainer cuts their end): by
        their count, or by their upper bound when the count is an estimate."""
        return sum(1 for n in self.lengths if _bound(n, self.margin) > self.cutoff_len)


def _bound(tokens: int, margin: float) -> int:
    """The most tokens a row counted at ``tokens`` may take (``margin`` 1: exact)."""
    return tokens if margin == 1.0 else math.ceil(tokens * margin)


def fit(
    lengths: Sequence[int], counter: TokenCounter, recipe: Mapping[str, Any], *, note: str | None
) -> Fit:
    """The SFT settings for rows of ``lengths`` tokens made by ``recipe`` (run.json's)."""
    output = recipe.get("output") or {}
    model = str(output.get("tokenizer") or DEFAULT_MODEL)
    thinking = output.get("reasoning", "keep") == "keep" and recipe.get("pipeline") != "envsim"
    template = output.get("template") or guess_template(model, thinking=thinking)
    if template is None:
        template = "default"
        guess = f"no template is known for {model}: set output.template (sft.yaml says default)"
        note = f"{note}; {guess}" if note else guess
    margin = 1.0 if counter.exact else ESTIMATE_MARGIN
    cutoff = cutoff_for([_bound(n, margin) for n in lengths])
    return Fit(model, str(template), cutoff, counter.name, tuple(lengths), note, margin)


def sft_config(dataset_dir: Path, dataset: str, fit: Fit) -> dict[str, Any]:
    """A LLaMA-Factory ``llamafactory-cli train`` config: LoRA SFT of ``fit.model``."""
    return {
        "model_name_or_path": fit.model,
        "trust_remote_code": True,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_rank": 16,
        "lora_target": "all",
        "dataset_dir": str(dataset_dir),
        "dataset": dataset,
        "template": fit.template,
        "cutoff_len": fit.cutoff_len,
        "overwrite_cache": True,
        "preprocessing_num_workers": 8,
        "output_dir": f"saves/{dataset}/lora/sft",
        "logging_steps": 10,
        "save_steps": 500,
        "plot_loss": True,
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 8,
        "learning_rate": 1.0e-4,
        "num_train_epochs": 2.0,
        "lr_scheduler_type": "cosine",
        "bf16": True,
    }


def _header(fit: Fit, path: Path) -> list[str]:
    n = len(fit.lengths)
    longest = max(fit.lengths, default=0)
    lines = [
        "LLaMA-Factory SFT config written by factory for this folder (docs/training.md).",
        f"Train in LLaMA-Factory's own environment: llamafactory-cli train {path}",
        f"cutoff_len {fit.cutoff_len}: the smallest multiple of {ROUND_TO} that holds at least "
        f"{COVERAGE:.0%} of the {n:,} rows whole" + ("" if fit.exact else ", at their upper bound"),
    ]
    if fit.exact:
        lines += [
            f"tokens counted exactly with the {fit.counted_with} (output.tokenizer)",
            f"rows longer (their end would be cut): {fit.over:,}; longest row {longest:,} tokens",
        ]
    else:
        lines += [
            f"tokens estimated ({fit.counted_with}), not counted: JSON and ids take as few as "
            f"{DENSEST_CHARS_PER_TOKEN:g} characters per token, so a row's upper bound is "
            f"{fit.margin - 1:.0%} more tokens than its estimate",
            f"rows that may be longer (their end would be cut): {fit.over:,}; longest row "
            f"{longest:,} tokens estimated, at most {_bound(longest, fit.margin):,}",
            "set output.tokenizer (the model's tokenizer, on disk) for an exact count and a "
            "tighter cutoff_len",
        ]
    if fit.note:
        lines.append(f"note: {fit.note}")
    return [f"# {line}" for line in lines]


def write_sft(out_dir: Path, dataset: str, fit: Fit) -> Path:
    """Write ``OUT/llamafactory/sft.yaml`` (atomically); returns its path.

    Raises:
        OutputWriteError: the file could not be written.
    """
    out_dir = Path(out_dir)
    body = yaml.safe_dump(sft_config(out_dir.resolve(), dataset, fit), sort_keys=False)
    path = out_dir / SFT_FILE
    atomic_write_text(path, "\n".join(_header(fit, path.resolve())) + "\n" + body, out_dir)
    return path
