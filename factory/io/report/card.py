"""``OUT/README.md``: a Hugging Face dataset card, so the folder is a dataset as it is.

Why: ``datasets.load_dataset(OUT)`` and the Hub read the card's YAML header; its
``configs`` name exactly the accepted shards (``data/*.parquet``), so the
response cache, rejects and logs beside them are never read as data, and the
``dataset_info`` features are the shards' own Arrow schema. The body says how
the data was made: the recipe, the counts, and the provenance (seeds, models,
dates, whether the development server answered instead of a real model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from factory.io.report.folder import OutputFolder
from factory.io.writer import atomic_write_text
from factory.secrets import redact_obj

__all__ = [
    "CARD_FILE",
    "CARD_SETTINGS",
    "DEFAULT_LICENSE",
    "build_card",
    "card_license",
    "card_metadata",
    "chosen_license",
    "saved_license",
    "size_category",
    "write_card",
]

CARD_FILE = "README.md"
# What the user chose for the card (its license): not a generated file, so a resumed run,
# which deletes and rewrites README.md, keeps it.
CARD_SETTINGS = "card.json"
DEFAULT_LICENSE = "other"
# Recipe keys that describe this machine, not how the data was made (and may name hosts).
_MACHINE_KEYS = ("output", "ray", "cache")
_SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"),
          (1_000_000, "100K<n<1M"), (10_000_000, "1M<n<10M"))  # fmt: skip


def size_category(rows: int) -> str:
    """The Hub's ``size_categories`` value for ``rows`` examples."""
    for limit, name in _SIZES:
        if rows < limit:
            return name
    return "n>10M"


def _features(folder: OutputFolder) -> list[dict[str, Any]] | None:
    """The shards' Arrow schema as the ``dataset_info.features`` YAML ``datasets`` writes."""
    from datasets import DatasetInfo, Features

    files = folder.data_files()
    if not files:
        return None
    features = Features.from_arrow_schema(pq.ParquetFile(files[0]).schema_arrow)
    return list(DatasetInfo(features=features)._to_yaml_dict()["features"])


def _recipe(folder: OutputFolder) -> dict[str, Any]:
    recipe = dict(folder.state.get("recipe") or {})
    llm = dict(recipe.get("llm") or {})
    if llm:  # endpoint addresses are the operator's business, not the dataset's
        llm.pop("endpoints", None)
        recipe["llm"] = llm
    for key in _MACHINE_KEYS:
        recipe.pop(key, None)
    return dict(redact_obj(recipe))


def _models(folder: OutputFolder) -> list[str]:
    recipe = folder.state.get("recipe") or {}
    models = []
    if folder.manifest.get("model"):
        models.append(str(folder.manifest["model"]))
    prefilter = recipe.get("prefilter") or {}
    if prefilter.get("enabled") and prefilter.get("model"):
        models.append(str(prefilter["model"]))
    return sorted(set(models))


def card_metadata(folder: OutputFolder, *, license_id: str = DEFAULT_LICENSE) -> dict[str, Any]:
    """The card's YAML header (a dict): configs, features, license, sizes, provenance."""
    m = folder.manifest
    accepted = int((m.get("totals") or {}).get("accepted") or 0)
    meta: dict[str, Any] = {
        "license": license_id,
        "pretty_name": f"factory {m.get('recipe', 'dataset')}",
        "language": ["en"],
        "task_categories": ["text-generation"],
        "tags": ["synthetic", "tool-use", "agents", "factory", f"factory-{folder.pipeline}"],
        "size_categories": [size_category(accepted)],
    }
    features = _features(folder)
    if features is not None:
        meta["configs"] = [
            {
                "config_name": "default",
                "data_files": [{"split": "train", "path": "data/*.parquet"}],
            }
        ]
        num_bytes, download_size = _sizes(folder)
        meta["dataset_info"] = {
            "features": features,
            "splits": [{"name": "train", "num_bytes": num_bytes, "num_examples": accepted}],
            "download_size": download_size,
            "dataset_size": num_bytes,
        }
    return meta


def _sizes(folder: OutputFolder) -> tuple[int, int]:
    """``(num_bytes, download_size)`` of the accepted shards, from their footers alone.

    ``datasets`` ignores (with a warning on every load) a card whose ``splits`` lack
    ``num_bytes``; it means the uncompressed data size, which each Parquet row group
    records, so no row is read. ``download_size`` is what the files weigh.
    """
    num_bytes = download = 0
    for file in folder.data_files():
        meta = pq.ParquetFile(file).metadata
        num_bytes += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        download += file.stat().st_size
    return num_bytes, download


def _provenance(folder: OutputFolder) -> dict[str, Any]:
    m, recipe = folder.manifest, folder.state.get("recipe") or {}
    seeds = m.get("seeds") or {}
    out: dict[str, Any] = {
        "recipe": m.get("recipe"),
        "pipeline": folder.pipeline,
        "config_hash": m.get("config_hash"),
        "seeds": (recipe.get("seeds") or {}).get("path"),
        "models": _models(folder) or ["none (no LLM)"],
        "started_at": m.get("started_at"),
        "finished_at": folder.state.get("updated"),
        "status": folder.state.get("status"),
        "generated_with_devserver": bool(m.get("generated_with_devserver", False)),
        "factory_version": (m.get("versions") or {}).get("factory"),
    }
    if seeds:
        out["seed_counts"] = {k: seeds.get(k) for k in ("total", "kept", "rejected", "failed")}
    return out


def build_card(folder: OutputFolder, *, license_id: str = DEFAULT_LICENSE) -> str:
    """The whole README.md: YAML header, then what a reader needs to trust the data."""
    m = folder.manifest
    meta = card_metadata(folder, license_id=license_id)
    totals = m.get("totals") or {}
    header = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True)
    prov = _provenance(folder)
    alpaca = folder.row_format == "alpaca"
    what = "simulator step samples" if alpaca else "tool-use agent trajectories"
    lines = [
        f"---\n{header}---",
        "",
        f"# {meta['pretty_name']}",
        "",
        f"Synthetic {what} made by the `factory` {folder.pipeline} pipeline from the recipe "
        f"`{m.get('recipe')}`.",
    ]
    if prov["generated_with_devserver"]:
        lines += [
            "",
            "**Generated with the development server**: every LLM answer came from "
            "factory's offline stand-in model, not a real model. Use it to test pipelines, "
            "not to train.",
        ]
    lines += [
        "",
        "## Load it",
        "",
        "```python",
        "from datasets import load_dataset",
        'ds = load_dataset("PATH_OR_REPO_ID", split="train")',
        "```",
        "",
        "LLaMA-Factory: point `dataset_dir` at this folder; `dataset_info.json` names the "
        f"dataset ({folder.row_format} format).",
        "",
        "## Counts",
        "",
        "| rows | count |",
        "| --- | ---: |",
        *(
            f"| {k} | {totals.get(k, 0)} |"
            for k in ("total", "accepted", "surplus", "rejected", "failed")
        ),
        "",
        "Only the accepted rows (`data/`) are the dataset; `report.html` shows the run "
        "(funnel, reasons, distributions, cost) and `manifest.json` every count.",
        "",
        "## Provenance",
        "",
        "```yaml",
        yaml.safe_dump(prov, sort_keys=False, allow_unicode=True).rstrip(),
        "```",
        "",
        "## Recipe",
        "",
        "```yaml",
        yaml.safe_dump(_recipe(folder), sort_keys=False, allow_unicode=True).rstrip(),
        "```",
        "",
        f"License: `{license_id}`"
        + (
            " (set it with `factory report OUT --license ID` before publishing)"
            if license_id == DEFAULT_LICENSE
            else ""
        )
        + ".",
        "",
    ]
    return "\n".join(lines)


def card_license(path: Path) -> str | None:
    """The ``license`` of an existing card's YAML header, or None (no card, no header)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    if not text.startswith("---\n"):
        return None
    header, _, _ = text[4:].partition("\n---")
    try:
        meta = yaml.safe_load(header)
    except yaml.YAMLError:
        return None
    found = meta.get("license") if isinstance(meta, dict) else None
    return found if isinstance(found, str) and found else None


def saved_license(out_dir: Path) -> str | None:
    """The license given once for this folder (``OUT/card.json``), or None."""
    try:
        found = json.loads((Path(out_dir) / CARD_SETTINGS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = found.get("license") if isinstance(found, dict) else None
    return value if isinstance(value, str) and value else None


def chosen_license(out_dir: Path, license_id: str | None = None) -> str:
    """The card's license: ``license_id`` if given, else the one given before (kept in
    ``OUT/card.json``, else named by an existing card), else ``other``."""
    return (
        license_id
        or saved_license(out_dir)
        or card_license(Path(out_dir) / CARD_FILE)
        or DEFAULT_LICENSE
    )


def write_card(out_dir: Path | str, *, license_id: str | None = None) -> Path:
    """Write ``OUT/README.md`` (atomically) and return its path.

    A ``license_id`` given is kept in ``OUT/card.json``, which a resumed or extended
    run and ``--fresh`` leave in place (the card itself is rewritten by every run), so
    the license given once stays; None uses that one, else ``other``.

    Raises:
        ConfigError: ``out_dir`` is not a run's output folder.
        OutputWriteError: the file could not be written.
    """
    folder = OutputFolder(out_dir)
    path = folder.path / CARD_FILE
    chosen = chosen_license(folder.path, license_id)
    if license_id is not None and license_id != saved_license(folder.path):
        body = json.dumps({"license": license_id}, indent=2) + "\n"
        atomic_write_text(folder.path / CARD_SETTINGS, body, folder.path)
    atomic_write_text(path, build_card(folder, license_id=chosen), folder.path)
    return path
