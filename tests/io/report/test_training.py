"""``OUT/llamafactory/sft.yaml``: a LLaMA-Factory config whose cutoff_len fits the rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from factory.io.report import write_documents
from factory.io.report.training import (
    CHARS_PER_TOKEN,
    DEFAULT_MODEL,
    DENSEST_CHARS_PER_TOKEN,
    ESTIMATE_MARGIN,
    MESSAGE_OVERHEAD,
    SFT_FILE,
    TokenCounter,
    cutoff_for,
    fit,
    guess_template,
    load_counter,
    row_tokens,
    sft_config,
    write_sft,
)
from tests.helpers import lfcompat
from tests.helpers.reportfolder import make_envsim_folder, make_folder


@given(st.lists(st.integers(min_value=1, max_value=60_000), min_size=1, max_size=400))
def test_cutoff_len_is_the_least_multiple_of_256_holding_99_percent(lengths: list[int]) -> None:
    cutoff = cutoff_for(lengths)
    assert cutoff % 256 == 0 and cutoff >= 256
    assert sum(n <= cutoff for n in lengths) >= 0.99 * len(lengths)
    if cutoff > 256:
        assert sum(n <= cutoff - 256 for n in lengths) < 0.99 * len(lengths)


def test_a_row_is_counted_as_the_trainer_sees_it() -> None:
    def count(text: str) -> int:
        return len(text)  # a character tokenizer: the pieces are easy to see

    tools = json.dumps([{"name": "t", "parameters": {}}])
    row = {
        "system": "S" * 100,
        "tools": tools,
        "conversations": [{"from": "human", "value": "h" * 10}, {"from": "gpt", "value": "g" * 7}],
    }
    n = row_tokens(row, count)
    # system + the template's tool block (each tool wrapped as a function) + 2 turns + markup
    assert n > 100 + len(tools) + 17 + 3 * MESSAGE_OVERHEAD
    assert n == row_tokens({**row, "tools": [{"name": "t", "parameters": {}}]}, count)
    alpaca = {"system": "", "instruction": "i" * 50, "input": "x" * 20, "output": "o" * 30}
    assert row_tokens(alpaca, count) == 50 + 1 + 20 + 30 + 2 * MESSAGE_OVERHEAD
    counter, note = load_counter(None)
    assert note is None and counter.count("x" * 301) == math.ceil(301 / CHARS_PER_TOKEN)


@pytest.mark.parametrize(
    ("model", "thinking", "template"),
    [
        ("Qwen/Qwen3-8B", True, "qwen3"),
        ("Qwen/Qwen3-8B", False, "qwen3_nothink"),
        ("Qwen/Qwen2.5-7B-Instruct", True, "qwen"),
        ("meta-llama/Llama-3.1-8B-Instruct", True, "llama3"),
        ("mistralai/Mistral-7B-Instruct-v0.3", False, "mistral"),
        ("THUDM/glm-4-9b-chat", True, "glm4"),
        ("/models/my-own-model", True, None),
    ],
)
def test_the_template_renders_the_models_tool_format(model, thinking, template) -> None:
    assert guess_template(model, thinking=thinking) == template
    if template is not None:
        assert template in lfcompat.tool_templates()


def test_the_config_holds_only_keys_llamafactory_accepts(tmp_path: Path) -> None:
    counter, _ = load_counter(None)
    f = fit([100, 200, 5000], counter, {"output": {}, "pipeline": "amplify"}, note=None)
    # estimated: the cutoff holds the longest row's upper bound, 5,000 x 1.2
    assert (f.model, f.template, f.cutoff_len, f.over) == (DEFAULT_MODEL, "qwen3", 6144, 0)
    config = sft_config(tmp_path, "factory_airline", f)
    assert set(config) <= lfcompat.argument_names()
    unknown = fit([10], counter, {"output": {"tokenizer": "/m/x"}}, note=None)
    assert unknown.template == "default" and "set output.template" in (unknown.note or "")
    chosen = fit([10], counter, {"output": {"tokenizer": "/m/x", "template": "llama3"}}, note=None)
    assert chosen.template == "llama3" and chosen.note is None


def test_an_estimated_count_keeps_a_margin_and_the_header_says_which_count(
    tmp_path: Path,
) -> None:
    # Issue 39: a row estimated at 1,255 tokens (3 characters per token) got cutoff_len
    # 1280; JSON and ids at 2.5 characters per token make it 1,506 tokens.
    estimate, _ = load_counter(None)
    lengths = [900] * 50 + [1255] * 50
    f = fit(lengths, estimate, {"output": {}}, note=None)
    assert not estimate.exact and f.margin == pytest.approx(ESTIMATE_MARGIN)
    assert f.cutoff_len >= math.ceil(1255 * CHARS_PER_TOKEN / DENSEST_CHARS_PER_TOKEN)
    assert f.cutoff_len == 1536 and f.over == 0
    exact = TokenCounter("tokenizer /m/qwen", len, exact=True)
    g = fit(lengths, exact, {"output": {"tokenizer": "/m/qwen"}}, note=None)
    assert g.cutoff_len == 1280 and g.margin == 1.0  # counted exactly: no margin needed
    assert fit([1300], exact, {"output": {}}, note=None).over == 0
    assert fit([1300], estimate, {"output": {}}, note=None).cutoff_len == 1792
    estimated = write_sft(tmp_path / "a", "d", f).read_text()
    head = [line for line in estimated.splitlines() if line.startswith("#")]
    assert any(
        "tokens estimated (estimate: 3 characters per token), not counted" in h for h in head
    )
    assert any("longest row 1,255 tokens estimated, at most 1,506" in h for h in head)
    assert any("set output.tokenizer" in h for h in head)
    counted = write_sft(tmp_path / "b", "d", g).read_text()
    assert "# tokens counted exactly with the tokenizer /m/qwen (output.tokenizer)" in counted
    assert "tokens estimated" not in counted


def _local_tokenizer(folder: Path) -> Path:
    """A real (tiny) tokenizer on disk, as output.tokenizer may name a local folder."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    text = (Path(__file__).resolve().parents[3] / "prompts" / "airline" / "policy.md").read_text()
    tok.train_from_iterator(
        [text] * 3, trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"])
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.save_pretrained(str(folder))
    return folder


def test_the_recipes_tokenizer_is_loaded_offline_and_counts(tmp_path: Path) -> None:
    folder = _local_tokenizer(tmp_path / "tok")
    counter, note = load_counter(str(folder))
    assert note is None and counter.name == f"tokenizer {folder}"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    text = "Cancel reservation ZFA04Y for mia_li_3668, please."
    assert counter.count(text) == len(tok.encode(text, add_special_tokens=False)) > 5
    missing, why = load_counter("no-such-org/no-such-model")
    assert missing.name.startswith("estimate") and "could not be loaded offline" in (why or "")


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_every_folder_gets_its_sft_config_and_the_report_shows_the_fit(tmp_path: Path) -> None:
    out = make_folder(tmp_path / "o")
    state = json.loads((out / "run.json").read_text())
    state["recipe"]["output"]["dataset_name"] = "factory_test"
    (out / "run.json").write_text(json.dumps(state))
    paths = write_documents(out)
    assert str(out / SFT_FILE) in paths
    text = (out / SFT_FILE).read_text()
    config = yaml.safe_load(text)
    assert config["dataset_dir"] == str(out.resolve()) and config["dataset"] == "factory_test"
    assert "factory_test" in json.loads((out / "dataset_info.json").read_text())
    assert config["template"] == "qwen3" and config["cutoff_len"] % 256 == 0
    assert f"llamafactory-cli train {(out / SFT_FILE).resolve()}" in text
    assert "99% of the 12 rows" in text and "estimate: 3 characters per token" in text
    page = (out / "report.html").read_text()
    assert "Training fit (LLaMA-Factory)" in page
    assert f'<td>cutoff_len</td><td class="n">{config["cutoff_len"]:,}</td>' in page


def test_envsim_rows_train_with_their_system_prompt(tmp_path: Path) -> None:
    import datasets

    from factory.io.writer import write_dataset_info

    out = make_envsim_folder(tmp_path / "o")
    write_dataset_info(out, "factory_envsim", formatting="alpaca")
    write_documents(out)
    config = yaml.safe_load((out / SFT_FILE).read_text())
    assert config["dataset"] == "factory_envsim" and config["template"] == "qwen3_nothink"
    lf = lfcompat.load()
    entry = json.loads((out / "dataset_info.json").read_text())["factory_envsim"]
    attr = lfcompat.DatasetAttr.from_info(entry)
    ds = datasets.load_dataset("parquet", data_dir=str(out / "data"), split="train")
    convert = lf.converter.get_dataset_converter(attr.formatting, attr, lfcompat.DataArgs())
    for example in ds:
        aligned = convert(example)
        assert aligned["_system"] == example["system"] != ""  # no template default system
        assert aligned["_prompt"][0]["content"].startswith("### Tool")
