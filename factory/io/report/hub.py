"""``factory push OUT REPO_ID``: publish an output folder as a Hugging Face dataset.

Why so little: the folder already is a dataset (``card``: README.md with its
configs); pushing uploads the files a reader needs and nothing else: the
response cache, logs, rejects, the lock and the run state stay home. Everything
that can be checked without the network is checked first: the folder against its
manifest (``runstate.verify_output``), the repository id, and that a token exists
(``HF_TOKEN`` or huggingface_hub's own login, never a file of ours). The Hub's and
the network's failures become one ``UnreachableError`` line (exit 8), never a
traceback: a user without network or with a wrong token has done nothing wrong
that a stack trace would explain.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from factory.errors import ConfigError, UnreachableError
from factory.io.report.card import CARD_FILE, DEFAULT_LICENSE, chosen_license, write_card
from factory.io.report.folder import OutputFolder
from factory.io.report.page import REPORT_FILE, write_report
from factory.io.runstate import verify_output

__all__ = ["PUSHED", "hub_error", "push", "push_warnings"]

# What a dataset repository gets: the card, the shards, and how they were made.
PUSHED = [CARD_FILE, REPORT_FILE, "manifest.json", "dataset_info.json", "data/*.parquet"]


def push_warnings(out_dir: Path | str, license_id: str | None = None) -> list[str]:
    """What a person should know before publishing ``out_dir`` (one line each): rows
    the development server wrote, and a card whose license is still ``other``."""
    folder = OutputFolder(out_dir)
    lines = []
    if folder.manifest.get("generated_with_devserver"):
        lines.append(
            "these rows were generated with the development server (factory's offline "
            "stand-in model), not a real model: fit for testing a pipeline, not for training"
        )
    if chosen_license(folder.path, license_id) == DEFAULT_LICENSE:
        lines.append(
            f"the card's license is `{DEFAULT_LICENSE}`: give --license ID (e.g. apache-2.0, "
            "cc-by-4.0, mit) so readers know how they may use the data"
        )
    return lines


def _check_folder(folder: OutputFolder, repo_id: str) -> None:
    if folder.state.get("status") not in ("done", "stopped"):
        raise ConfigError(
            f"{folder.path}: the run has not ended (run.json status "
            f"{folder.state.get('status')!r}); finish or resume it before pushing"
        )
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ConfigError(f"repository id {repo_id!r}: expected OWNER/NAME")
    verify_output(folder.path)


def _check_token(api: Any) -> None:
    """A token must exist before anything is sent (no network: env or the login file)."""
    from huggingface_hub import get_token

    if getattr(api, "token", None) or get_token():
        return
    raise ConfigError(
        "no Hugging Face token: set HF_TOKEN to a token with write access "
        "(huggingface.co/settings/tokens) or run `hf auth login`, then push again",
        key_path="HF_TOKEN",
    )


def hub_error(exc: BaseException, repo_id: str, endpoint: str) -> UnreachableError:
    """One line for a failure of the Hub or of the network on the way to it."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        server = str(getattr(exc, "server_message", None) or "").strip()
        first = server.splitlines()[0] if server else str(exc).strip().splitlines()[0]
        hint = {
            401: "the token was refused: check HF_TOKEN or run `hf auth login`",
            403: f"the token may not write to {repo_id}: use a token with write access "
            "to its owner",
            404: f"{repo_id} was not found: check OWNER (your user or an organisation)",
        }.get(status, "try again later; nothing was published if the upload did not finish")
        return UnreachableError(f"the Hub answered {status} for {repo_id}: {first[:200]}; {hint}")
    reason = " ".join(str(exc).split())[:200] or type(exc).__name__
    return UnreachableError(
        f"cannot reach the Hugging Face Hub at {endpoint} ({type(exc).__name__}: {reason}); "
        "check the network (or HF_ENDPOINT, HF_HUB_OFFLINE) and push again"
    )


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
        license_id: rewrite the card with this license first (kept for later cards);
            default: the license given before, else ``other``.
        api: a ``huggingface_hub.HfApi`` (tests pass one whose upload is a fake).

    Returns:
        what ``HfApi.upload_folder`` returns (the commit).

    Raises:
        ConfigError: not a finished run's folder, ``repo_id`` not ``owner/name``, or no
            token (all checked before any network use).
        OutputWriteError: the folder does not match its manifest.
        UnreachableError: the Hub refused the upload or could not be reached.
    """
    from huggingface_hub import HfApi
    from huggingface_hub import errors as hub_errors

    folder = OutputFolder(out_dir)
    _check_folder(folder, repo_id)
    api = HfApi() if api is None else api
    _check_token(api)
    if license_id is not None or not (folder.path / CARD_FILE).is_file():
        write_card(folder.path, license_id=license_id)
    if not (folder.path / REPORT_FILE).is_file():
        write_report(folder.path)
    try:
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        return api.upload_folder(
            folder_path=str(folder.path),
            repo_id=repo_id,
            repo_type="dataset",
            allow_patterns=PUSHED,
            commit_message=f"factory: {folder.manifest.get('recipe', 'dataset')} "
            f"({(folder.manifest.get('totals') or {}).get('accepted', 0)} rows)",
        )
    except (hub_errors.HTTPError, hub_errors.HFValidationError, OSError) as exc:
        endpoint = str(getattr(api, "endpoint", None) or "https://huggingface.co")
        raise hub_error(exc, repo_id, endpoint) from exc
