"""What a person reads of a finished run: the HTML report, the terminal view, the
dataset card, the LLaMA-Factory training config (``training``) and the Hub upload, all
from the output folder (``folder``).

Lives in ``io`` because it reads and writes output folders only: the engine
calls ``write_documents`` at the end of a run, and the CLI (``factory.cli``) calls
the same functions on demand.
"""

from __future__ import annotations

from factory.io.report.card import CARD_FILE, write_card
from factory.io.report.folder import OutputFolder
from factory.io.report.page import REPORT_FILE, write_report

__all__ = [
    "CARD_FILE",
    "REPORT_FILE",
    "OutputFolder",
    "write_card",
    "write_documents",
    "write_report",
]


def write_documents(out_dir: object, *, license_id: str | None = None) -> list[str]:
    """Write ``report.html``, ``llamafactory/sft.yaml`` and ``README.md`` (the dataset
    card) into a run's folder, from one pass over its rows; returns their paths.

    Raises:
        ConfigError: not a run's output folder.
        OutputWriteError: a file could not be written.
    """
    import json
    from pathlib import Path

    from factory.io.report.page import analyse
    from factory.io.report.training import write_sft

    folder = OutputFolder(Path(str(out_dir)))
    analysis = analyse(folder)
    report = write_report(folder.path, analysis=analysis)
    name = ((folder.state.get("recipe") or {}).get("output") or {}).get("dataset_name")
    info = folder.path / "dataset_info.json"
    if not name and info.is_file():  # the folder's own LLaMA-Factory entry
        name = next(iter(json.loads(info.read_text(encoding="utf-8"))), None)
    paths = [str(report)]
    if name and analysis.fit.lengths:
        paths.append(str(write_sft(folder.path, str(name), analysis.fit)))
    paths.append(str(write_card(folder.path, license_id=license_id)))
    return paths
