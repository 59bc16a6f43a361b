"""Load LLaMA-Factory's own data converter and function formatter without its heavy imports.

``pip install --no-deps llamafactory`` puts its source on disk; importing the
package itself would pull torch and transformers. The converter modules need
only ``datasets``/``fsspec`` and a logger, so we register light parent packages
and a recording logger, then import the real ``converter``, ``data_utils``,
``tool_utils`` and ``formatter`` modules from the installed files.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


class RecordingLogger:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning_rank0(self, msg: str, *a: Any) -> None:
        self.warnings.append(str(msg))

    warning = warning_rank0
    warning_rank0_once = warning_rank0

    def info_rank0(self, *a: Any, **k: Any) -> None:
        pass

    info = debug = info_rank0


LOGGER = RecordingLogger()


@dataclass
class LF:
    converter: Any
    formatter: Any
    tool_utils: Any
    logger: RecordingLogger = field(default_factory=lambda: LOGGER)


def load() -> LF:
    spec = importlib.util.find_spec("llamafactory")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(
            "llamafactory is not installed (README install: pip install --no-deps llamafactory)"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    saved = {
        k: v for k, v in sys.modules.items() if k == "llamafactory" or k.startswith("llamafactory.")
    }
    try:
        for name, path in (
            ("llamafactory", root),
            ("llamafactory.data", root / "data"),
            ("llamafactory.extras", root / "extras"),
        ):
            mod = types.ModuleType(name)
            mod.__path__ = [str(path)]
            sys.modules[name] = mod
        log = types.ModuleType("llamafactory.extras.logging")
        log.get_logger = lambda name=None: LOGGER  # type: ignore[attr-defined]
        sys.modules["llamafactory.extras.logging"] = log
        return LF(
            converter=importlib.import_module("llamafactory.data.converter"),
            formatter=importlib.import_module("llamafactory.data.formatter"),
            tool_utils=importlib.import_module("llamafactory.data.tool_utils"),
        )
    finally:
        for k in [k for k in sys.modules if k == "llamafactory" or k.startswith("llamafactory.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@dataclass
class DatasetAttr:
    """The attributes SharegptDatasetConverter reads, with LLaMA-Factory's defaults
    overridden by a dataset_info.json entry (as its parser does)."""

    formatting: str = "sharegpt"
    load_from: str = "file"
    ranking: bool = False
    system: str | None = None
    tools: str | None = None
    images: str | None = None
    videos: str | None = None
    audios: str | None = None
    chosen: str | None = None
    rejected: str | None = None
    kto_tag: str | None = None
    prompt: str | None = "instruction"
    query: str | None = "input"
    response: str | None = "output"
    history: str | None = None
    messages: str | None = "conversations"
    role_tag: str | None = "from"
    content_tag: str | None = "value"
    user_tag: str | None = "human"
    assistant_tag: str | None = "gpt"
    observation_tag: str | None = "observation"
    function_tag: str | None = "function_call"
    system_tag: str | None = "system"

    @classmethod
    def from_info(cls, entry: dict[str, Any]) -> DatasetAttr:
        attr = cls(formatting=entry.get("formatting", "alpaca"))
        for key, value in {**entry.get("columns", {}), **entry.get("tags", {})}.items():
            setattr(attr, key, value)
        return attr


@dataclass
class DataArgs:
    media_dir: str = ""
    streaming: bool = True
    preprocessing_num_workers: int | None = None
    overwrite_cache: bool = True


def _installed_root() -> Path:
    spec = importlib.util.find_spec("llamafactory")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(
            "llamafactory is not installed (README install: pip install --no-deps llamafactory)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def argument_names() -> set[str]:
    """Every key ``llamafactory-cli train CONFIG.yaml`` accepts: the fields of its argument
    dataclasses (read from the installed source, which needs torch to import) and of
    transformers' ``Seq2SeqTrainingArguments``."""
    import ast
    import dataclasses

    transformers = pytest.importorskip("transformers")
    names = {f.name for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)}
    for path in sorted((_installed_root() / "hparams").glob("*_args.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names |= {
                    s.target.id
                    for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                }
    return names


def tool_templates() -> set[str]:
    """LLaMA-Factory's templates that render the tools column in their model family's own
    tool format (a ``format_tools`` of their own; the others use a generic one)."""
    import re

    text = (_installed_root() / "data" / "template.py").read_text(encoding="utf-8")
    found = set()
    for block in text.split("register_template(")[1:]:
        name = re.search(r'name="([^"]+)"', block)
        body = block.split("\nregister_template", 1)[0].split("\n)\n", 1)[0]
        if name and "format_tools=" in body:
            found.add(name.group(1))
    return found


def converted(lf: LF, out: Path) -> tuple[int, list[dict]]:
    """An output folder's rows as LLaMA-Factory's own converter makes them, with the count read."""
    import datasets

    info = json.loads((out / "dataset_info.json").read_text())
    ((_, entry),) = info.items()
    attr = DatasetAttr.from_info(entry)
    ds = datasets.load_dataset("parquet", data_dir=str(out / entry["file_name"]), split="train")
    conv = lf.converter.get_dataset_converter(attr.formatting, attr, DataArgs())
    rows = [conv(example) for example in ds]
    return ds.num_rows, rows


def check_rows(lf: LF, rows: list[dict]) -> None:
    """Each converted row passes LLaMA-Factory's supervised filter and its formatters."""
    fmt = lf.formatter.FunctionFormatter(slots=["{{content}}"], tool_format="default")
    tools_util = lf.tool_utils.get_tool_utils("default")
    for row in rows:
        prompt, response = row["_prompt"], row["_response"]
        # LLaMA-Factory's supervised preprocess drops anything else ("Dropped invalid example").
        assert len(prompt) % 2 == 1 and len(response) == 1, row
        for message in [*prompt, *response]:
            if message["role"] == "function":
                fmt.apply(content=message["content"], thought_words=("<think>", "</think>"))
        if row["_tools"]:
            assert tools_util.tool_formatter(json.loads(row["_tools"]))
