"""``factory push OUT REPO_ID``: publish an output folder as a Hugging Face dataset.

Why so little: the folder already is a dataset (``card``: README.md with its
configs); pushing uploads the files a reader needs and nothing else: the
response cache, logs, rejects, the lock and the run state stay home. The folder
is checked against its manifest first (``runstate.verify_output``), so what is
published is what the manifest counts. The token comes from the environment
(``HF_TOKEN``) or huggingface_hub's own login, never from a file of ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from factory.errors import ConfigError
from factory.io.report.card import CARD_FILE, write_card
from factory.io.report.folder import OutputFolder
from factory.io.report.page import REPORT_FILE, write_report
from factory.io.runstate import verify_output

__all__ = ["PUSHED", "push"]

# What a dataset repository gets: the card, the shards, and how they were made.
PUSHED = [CARD_FILE, REPORT_FILE, "manifest.json", "dataset_info.json", "data/*.parquet"]


def push(
    out_dir: Path | str,
    repo_id: str,
    *,
    private: bool = False,
    license_id: str | None = None,
    api: Any = None,
) -> Any:
    """Upload ``out_dir`` to the dataset repository ``repo_id`` (created if needed).

    Args:
        out_dir: a finished run's output folder.
        repo_id: ``user/name`` or ``org/name``.
        private: create the repository private.
        license_id: rewrite the card with this license first (default: keep the card's).
        api: a ``huggingface_hub.HfApi`` (tests pass one whose upload is a fake).

    Returns:
        what ``HfApi.upload_folder`` returns (the commit).

    Raises:
        ConfigError: not a finished run's folder, or ``repo_id`` not ``owner/name``.
        OutputWriteError: the folder does not match its manifest.
    """
    folder = OutputFolder(out_dir)
    if folder.state.get("status") not in ("done", "stopped"):
        raise ConfigError(
            f"{folder.path}: the run has not ended (run.json status "
            f"{folder.state.get('status')!r}); finish or resume it before pushing"
        )
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ConfigError(f"repository id {repo_id!r}: expected OWNER/NAME")
    verify_output(folder.path)
    if license_id is not None or not (folder.path / CARD_FILE).is_file():
        write_card(folder.path, license_id=license_id)
    if not (folder.path / REPORT_FILE).is_file():
        write_report(folder.path)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
    return api.upload_folder(
        folder_path=str(folder.path),
        repo_id=repo_id,
        repo_type="dataset",
        allow_patterns=PUSHED,
        commit_message=f"factory: {folder.manifest.get('recipe', 'dataset')} "
        f"({(folder.manifest.get('totals') or {}).get('accepted', 0)} rows)",
    )
