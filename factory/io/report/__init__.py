"""What a person reads of a finished run: the HTML report, the terminal view, the
dataset card and the Hub upload, all from the output folder (``folder``).

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


def write_documents(out_dir: object) -> list[str]:
    """Write ``report.html`` and ``README.md`` (the dataset card) into a run's folder;
    returns their paths."""
    from pathlib import Path

    path = Path(str(out_dir))
    return [str(write_report(path)), str(write_card(path))]
