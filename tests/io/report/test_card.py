"""``OUT/README.md`` (the Hugging Face dataset card) and ``factory push``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from factory.cli import main
from factory.errors import ConfigError, OutputWriteError
from factory.io.report.card import chosen_license, size_category, write_card
from factory.io.report.hub import PUSHED, push
from tests.helpers.reportfolder import make_folder


def _header(card: str) -> dict[str, Any]:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n", 2)[1])


def test_the_card_has_the_hub_metadata_and_the_provenance(tmp_path: Path) -> None:
    out = make_folder(tmp_path / "o")
    card = write_card(out, license_id="apache-2.0").read_text(encoding="utf-8")
    meta = _header(card)
    assert meta["license"] == "apache-2.0" and meta["size_categories"] == ["n<1K"]
    assert meta["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "data/*.parquet"}]}
    ]
    names = [f["name"] for f in meta["dataset_info"]["features"]]
    assert names == ["conversations", "system", "tools", "id", "meta"]
    (split,) = meta["dataset_info"]["splits"]
    assert split["name"] == "train" and split["num_examples"] == 12
    assert split["num_bytes"] > 0 and meta["dataset_info"]["dataset_size"] == split["num_bytes"]
    assert meta["dataset_info"]["download_size"] == sum(
        f.stat().st_size for f in (out / "data").glob("*.parquet")
    )
    assert (
        "generated_with_devserver: true" in card and "Generated with the development server" in card
    )
    assert "models:\n- factory-dev" in card and "seeds/airline/seeds.jsonl" in card
    assert "| accepted | 12 |" in card and "started_at:" in card
    assert "10.0.0.7" not in card  # the operator's endpoints are not the dataset's business


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_a_license_once_set_stays_when_the_card_is_written_again(tmp_path: Path) -> None:
    from factory.io.report import write_documents
    from factory.io.runstate import GENERATED

    out = make_folder(tmp_path / "o")
    assert _header(write_card(out).read_text(encoding="utf-8"))["license"] == "other"
    assert main(["report", str(out), "--license", "cc-by-4.0"]) == 0
    # a resumed run deletes the documents it generates, then writes them again without one
    assert "README.md" in GENERATED
    (out / "README.md").unlink()
    write_documents(out)
    card = (out / "README.md").read_text(encoding="utf-8")
    assert _header(card)["license"] == "cc-by-4.0" and "License: `cc-by-4.0`" in card
    assert main(["report", str(out)]) == 0
    assert _header((out / "README.md").read_text(encoding="utf-8"))["license"] == "cc-by-4.0"
    explicit = write_card(out, license_id="mit").read_text(encoding="utf-8")
    assert _header(explicit)["license"] == "mit"


def test_the_folder_loads_with_datasets_as_it_is_with_no_warning(tmp_path: Path) -> None:
    import logging

    from datasets import load_dataset

    out = make_folder(tmp_path / "o")
    (out / "cache").mkdir()  # what else a run leaves: never read as data
    (out / "cache" / "seg-0.jsonl").write_text('{"request_id": "x", "text": "paid"}\n')
    write_card(out)
    heard: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: heard.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("datasets")  # datasets logs there, not through warnings
    logger.addHandler(handler)
    try:
        ds = load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    finally:
        logger.removeHandler(handler)
    assert heard == []  # e.g. "The `splits` field in YAML is malformed" (no num_bytes)
    assert ds.num_rows == 12
    assert ds.column_names == ["conversations", "system", "tools", "id", "meta"]
    assert ds[0]["conversations"][0]["from"] == "human"


@pytest.mark.parametrize(
    ("rows", "category"),
    [(0, "n<1K"), (999, "n<1K"), (1000, "1K<n<10K"), (90_000, "10K<n<100K"), (10**8, "n>10M")],
)
def test_size_categories(rows: int, category: str) -> None:
    assert size_category(rows) == category


class FakeApi:
    """Records what ``HfApi`` would be asked; never touches the network."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def create_repo(self, *args: Any, **kw: Any) -> str:
        self.calls.append(("create_repo", args, kw))
        return "url"

    def upload_folder(self, *args: Any, **kw: Any) -> str:
        self.calls.append(("upload_folder", args, kw))
        return "commit-1"


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_push_uploads_the_dataset_files_only(tmp_path: Path) -> None:
    out = make_folder(tmp_path / "o")
    api = FakeApi()
    api.token = "hf_not_a_real_token"  # type: ignore[attr-defined]
    assert push(out, "me/airline", api=api, license_id="mit") == "commit-1"
    (create, cargs, ckw), (upload, _, ukw) = api.calls
    assert create == "create_repo" and cargs == ("me/airline",)
    assert ckw == {"repo_type": "dataset", "private": False, "exist_ok": True}
    assert upload == "upload_folder" and ukw["repo_type"] == "dataset"
    assert ukw["folder_path"] == str(out) and ukw["allow_patterns"] == PUSHED
    assert "cache" not in json.dumps(PUSHED) and "rejects" not in json.dumps(PUSHED)
    assert _header((out / "README.md").read_text())["license"] == "mit"
    assert (out / "report.html").is_file()  # what it pushes exists


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_push_through_the_command_stops_where_the_network_would_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import huggingface_hub

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    api = FakeApi()
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", api.create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", api.upload_folder)
    out = make_folder(tmp_path / "o")
    assert main(["push", str(out), "me/airline", "--private"]) == 0
    assert [c[0] for c in api.calls] == ["create_repo", "upload_folder"]
    assert api.calls[0][2]["private"] is True
    assert "me/airline" in capsys.readouterr().out


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_push_reads_an_output_on_object_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    from factory.io.objectstore import S3Store
    from tests.helpers import s3

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    out = make_folder(tmp_path / "o")
    uri = f"s3://{s3.new_bucket()}/runs/o"
    store = S3Store(uri, s3.client())
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        store.upload(path.relative_to(out).as_posix(), path)
    sent: list[set[str]] = []

    def upload_folder(*args: Any, **kw: Any) -> str:  # what the Hub would receive
        folder = Path(kw["folder_path"])
        sent.append({p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()})
        return "commit-1"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", FakeApi().create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    assert main(["push", uri, "me/airline"]) == 0
    assert sent and {"manifest.json", "data/part-00000.parquet", "README.md"} <= sent[0]


def test_push_refuses_a_folder_that_does_not_match_its_manifest(tmp_path: Path) -> None:
    out = make_folder(tmp_path / "o")
    (out / "data" / "part-00000.parquet").unlink()
    with pytest.raises(OutputWriteError, match="not on disk"):
        push(out, "me/airline", api=FakeApi())  # before the token is looked for
    state = json.loads((out / "run.json").read_text())
    state["status"] = "running"
    (out / "run.json").write_text(json.dumps(state))
    with pytest.raises(ConfigError, match="has not ended"):
        push(out, "me/airline", api=FakeApi())
    with pytest.raises(ConfigError, match="OWNER/NAME"):
        push(make_folder(tmp_path / "p"), "airline", api=FakeApi())


def test_fresh_keeps_the_license_given_for_the_card(tmp_path: Path) -> None:
    from factory.io.runstate import prepare_output
    from factory.recipe import load_recipe
    from tests.conftest import ROOT

    out = make_folder(tmp_path / "o")
    write_card(out, license_id="apache-2.0")
    cfg = load_recipe(ROOT / "pipelines" / "airline.yaml", [f"output.dir={out}"])
    assert prepare_output(cfg, out, fresh=True, retry_failed=False) == "new"
    assert not (out / "README.md").exists() and (out / "card.json").is_file()
    assert chosen_license(out) == "apache-2.0"


@pytest.fixture()
def no_hub_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


def test_push_without_a_token_stops_before_any_network_use(
    tmp_path: Path, no_hub_token: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = make_folder(tmp_path / "o")
    api = FakeApi()
    with pytest.raises(ConfigError, match="no Hugging Face token: set HF_TOKEN"):
        push(out, "me/airline", api=api)
    assert api.calls == []
    assert main(["push", str(out), "me/airline"]) == 2
    err = capsys.readouterr().err
    assert "hf auth login" in err and "Traceback" not in err


def _serve_hub(status: int, body: bytes) -> tuple[Any, str]:
    """A local stand-in for the Hub that answers every request with ``status``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (None, ["cannot reach the Hugging Face Hub at http://127.0.0.1:", "ConnectError"]),
        (401, ["the Hub answered 401 for me/airline: Invalid credentials", "HF_TOKEN"]),
        (500, ["the Hub answered 500 for me/airline", "try again later"]),
    ],
)
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_hub_and_network_failures_are_one_line_and_exit_8(
    status: int | None,
    words: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from huggingface_hub import constants

    from tests.helpers import free_port

    server = None
    if status is None:  # nothing listens there: connection refused
        endpoint = f"http://127.0.0.1:{free_port()}"
    else:
        server, endpoint = _serve_hub(status, b'{"error": "Invalid credentials in Authorization"}')
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    try:
        code = main(["push", str(make_folder(tmp_path / "o")), "me/airline"])
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    err = capsys.readouterr().err
    assert code == 8
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and all(w in errors[0] for w in words), err
    assert "Traceback" not in err and "hf_not_a_real_token" not in err


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_push_warns_about_devserver_rows_and_an_other_license(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import huggingface_hub

    api = FakeApi()
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", api.create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", api.upload_folder)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    out = make_folder(tmp_path / "o")  # written with the development server
    assert main(["push", str(out), "me/airline"]) == 0
    err = capsys.readouterr().err
    assert "warning: these rows were generated with the development server" in err
    assert "warning: the card's license is `other`: give --license ID" in err
    assert main(["push", str(out), "me/airline", "--license", "mit"]) == 0
    err = capsys.readouterr().err
    assert "development server" in err and "license" not in err
    assert chosen_license(out) == "mit"
