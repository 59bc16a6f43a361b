"""What an output folder holds, whether a run may continue it, and what a changed prompt
costs (``factory.io.runstate``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from factory.errors import ConfigError
from factory.io.cache import ResponseCache
from factory.io.runstate import PROMPTS_FILE, changed_keys, note_prompt_changes, prepare_output
from factory.recipe import load_recipe
from tests.conftest import ROOT


def test_changed_keys_ignore_resumable_settings() -> None:
    old = {
        "amplify": {"target": 10, "seed": 0, "max_cost_usd": 1},
        "llm": {"model": "a"},
        "ray": {"actors": 2},
    }
    new = {
        "amplify": {"target": 50, "seed": 1, "max_cost_usd": 9},
        "llm": {"model": "b"},
        "ray": {"actors": 4},
    }
    assert changed_keys(old, new) == ["amplify.seed", "llm.model"]


def test_prepare_output_resume_refuse_fresh_done(tmp_path) -> None:
    cfg = load_recipe(ROOT / "pipelines/airline-seeds.yaml")
    out = tmp_path / "o"
    assert prepare_output(cfg, out, fresh=False, retry_failed=False) == "new"
    (out / "data").mkdir()
    (out / "data" / "part-00000.parquet").write_bytes(b"x")
    (out / "cache").mkdir()
    (out / "cache" / "w.jsonl").write_text("{}")
    assert prepare_output(cfg, out, fresh=False, retry_failed=False) == "resume"
    assert not (out / "data").exists() and (out / "cache" / "w.jsonl").exists()
    other = load_recipe(ROOT / "pipelines/airline-seeds.yaml", ["output.reasoning=strip"])
    with pytest.raises(ConfigError) as info:
        prepare_output(other, out, fresh=False, retry_failed=False)
    assert info.value.key_path == "output.reasoning" and "--fresh" in str(info.value)
    assert prepare_output(other, out, fresh=True, retry_failed=False) == "new"
    assert (out / "cache" / "w.jsonl").exists()  # paid for: --fresh keeps it
    assert prepare_output(other, out, fresh=True, retry_failed=False, drop_cache=True) == "new"
    assert not (out / "cache").exists()


def test_a_resume_with_another_response_cache_is_refused_unless_asked(tmp_path) -> None:
    out = tmp_path / "o"
    first = load_recipe(ROOT / "pipelines/airline.yaml", [f"cache.path={tmp_path / 'c1'}"])
    assert prepare_output(first, out, fresh=False, retry_failed=False) == "new"
    (tmp_path / "c1" / "w.jsonl").write_text("{}\n{}\n")  # two paid answers
    assert prepare_output(first, out, fresh=False, retry_failed=False) == "resume"
    other = load_recipe(ROOT / "pipelines/airline.yaml", [f"cache.path={tmp_path / 'c2'}"])
    with pytest.raises(ConfigError) as info:
        prepare_output(other, out, fresh=False, retry_failed=False)
    assert info.value.key_path == "cache.path" and "--other-cache" in str(info.value)
    assert str(tmp_path / "c1") in str(info.value) and "2 answers" in str(info.value)
    assert prepare_output(other, out, fresh=False, retry_failed=False, other_cache=True)
    # a deleted cache is another cache too
    shutil.rmtree(tmp_path / "c2")
    with pytest.raises(ConfigError):
        prepare_output(other, out, fresh=False, retry_failed=False)


def test_a_damaged_finished_folder_is_rebuilt_or_refused_naming_the_file(tmp_path) -> None:
    from factory.errors import OutputDamaged
    from factory.io.runstate import finish_run, verify_output
    from factory.io.writer import Manifest, ShardWriter

    cfg = load_recipe(ROOT / "pipelines/airline.yaml")
    out = tmp_path / "o"
    prepare_output(cfg, out, fresh=False, retry_failed=False)
    writer = ShardWriter(out, shard_rows=2)
    row = {"conversations": [{"from": "human", "value": "hi"}], "system": "", "tools": ""}
    writer.extend({**row, "id": f"r{i}", "meta": "{}"} for i in range(3))
    writer.close()
    manifest = Manifest("r", "h")
    manifest.add_files(writer)
    manifest.write(out, total=3, accepted=3)
    finish_run(cfg, out, stopped_by=None)
    assert prepare_output(cfg, out, fresh=False, retry_failed=False) == "done"
    shard = out / "data" / "part-00001.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: the row count may still read fine
    shard.write_bytes(bytes(data))
    with pytest.raises(OutputDamaged) as info:
        verify_output(out, checksums=True)
    assert str(shard) in str(info.value)
    assert prepare_output(cfg, out, fresh=False, retry_failed=False) == "rebuild"
    assert not shard.exists()  # the generated files go; the cache stays for the rebuild
    no_cache = load_recipe(ROOT / "pipelines/airline.yaml", ["cache.enabled=false"])
    shutil.copytree(tmp_path / "o", tmp_path / "o2")
    finish_run_again = tmp_path / "o2"
    writer = ShardWriter(finish_run_again, shard_rows=5)
    writer.extend({**row, "id": f"r{i}", "meta": "{}"} for i in range(3))
    writer.close()
    manifest = Manifest("r", "h")
    manifest.add_files(writer)
    manifest.write(finish_run_again, total=3, accepted=3)
    finish_run(no_cache, finish_run_again, stopped_by=None)
    (finish_run_again / "data" / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(OutputDamaged) as info:
        prepare_output(no_cache, finish_run_again, fresh=False, retry_failed=False)
    assert "part-00000.parquet" in str(info.value) and info.value.exit_code == 7


def test_room_is_reserved_for_paid_answers_and_taken_when_the_disk_is_full(
    tmp_path, monkeypatch
) -> None:
    from factory.io import runstate
    from factory.io.runstate import RESERVE_FILE, UNSTORED_DIR, reserve_room, save_unstored

    out = tmp_path / "o"
    assert reserve_room(out, size=1 << 16)
    reserve = out / UNSTORED_DIR / RESERVE_FILE
    assert reserve.stat().st_blocks * 512 >= 1 << 16  # allocated, not sparse
    real = runstate.atomic_write_text
    calls = {"n": 0}

    def full_once(path, text, base=None):  # the first write finds the disk full
        calls["n"] += 1
        if calls["n"] == 1:
            from factory.errors import OutputWriteError

            raise OutputWriteError(path, OSError(28, "No space left on device"))
        return real(path, text, base)

    monkeypatch.setattr(runstate, "atomic_write_text", full_once)
    where = save_unstored(out, [("amplify-1", {"text": "paid"})])
    assert where == str(out / UNSTORED_DIR) + "/"
    assert len(list((out / UNSTORED_DIR).glob("*.jsonl"))) == 1
    assert 0 < reserve.stat().st_size < 1 << 16  # what it took, the rest kept for later


def test_answers_arriving_while_a_run_stops_on_a_full_disk_each_find_reserved_room(
    tmp_path, monkeypatch
) -> None:
    """Issue 33: the first answer the cache refused took the whole reserve, another
    writer on the volume (the cache, a shard) filled the freed room, and the answers that
    arrived while the run stopped found none: they went to the run's stderr, which is its
    log on the same full disk, and were paid again. Each takes only what it needs now."""
    import io

    from factory.errors import OutputWriteError
    from factory.io import runstate
    from factory.io.runstate import RESERVE_FILE, UNSTORED_DIR, reserve_room, save_unstored

    out = tmp_path / "o"
    size = 1 << 20
    assert reserve_room(out, size=size)
    reserve = out / UNSTORED_DIR / RESERVE_FILE
    disk = {"used": 0}  # bytes of the room the reserve gave back that are taken

    def given_back() -> int:
        return size - (reserve.stat().st_size if reserve.exists() else 0)

    def full_disk(path, text, base=None):  # only the room the reserve gave back is free
        if disk["used"] + len(text) > given_back():
            raise OutputWriteError(path, OSError(28, "No space left on device"))
        disk["used"] += len(text)
        Path(path).write_text(text)

    monkeypatch.setattr(runstate, "atomic_write_text", full_disk)
    for i in range(8):
        terminal = io.StringIO()
        record = {"text": f"paid answer {i} " + "x" * 5000}
        where = save_unstored(out, [(f"amplify-{i}", record)], console=terminal)
        assert where == str(out / UNSTORED_DIR) + "/", (i, where)
        assert terminal.getvalue() == ""
        disk["used"] = given_back()  # another writer on the volume takes what is left
    assert len(list((out / UNSTORED_DIR).glob("*.jsonl"))) == 8
    assert reserve.is_file()


def test_the_reserve_goes_when_a_run_ends_and_comes_back_with_the_next(tmp_path) -> None:
    # Issue 39: 16 MB of unstored/.reserve stayed in every finished folder.
    from factory.io.runstate import RESERVE_FILE, UNSTORED_DIR, finish_run
    from factory.io.writer import Manifest

    cfg = load_recipe(ROOT / "pipelines/airline.yaml", ["amplify.target=5"])
    out = tmp_path / "o"
    reserve = out / UNSTORED_DIR / RESERVE_FILE
    assert prepare_output(cfg, out, fresh=False, retry_failed=False) == "new"
    assert reserve.stat().st_size > 0
    Manifest("r", "h").write(out, total=0, accepted=0)
    finish_run(cfg, out, stopped_by="max_cost_usd")
    assert not (out / UNSTORED_DIR).exists()
    # the next run (a resume of the stopped one) reserves the room again before any call
    assert prepare_output(cfg, out, fresh=False, retry_failed=False) == "resume"
    assert reserve.stat().st_size > 0
    # answers saved there stay when the run ends; only the reserve goes
    (out / UNSTORED_DIR / "1-paid.jsonl").write_text("{}\n")
    Manifest("r", "h").write(out, total=0, accepted=0)
    finish_run(cfg, out, stopped_by=None)
    assert [p.name for p in (out / UNSTORED_DIR).iterdir()] == ["1-paid.jsonl"]
    extended = load_recipe(ROOT / "pipelines/airline.yaml", ["amplify.target=9"])
    assert prepare_output(extended, out, fresh=False, retry_failed=False) == "resume"
    assert reserve.stat().st_size > 0


def test_changed_prompts_name_the_stage_and_its_unusable_cached_answers(tmp_path: Path) -> None:
    cfg = load_recipe(ROOT / "pipelines" / "airline.yaml")
    out = tmp_path / "out"
    with ResponseCache(str(out / "cache")) as cache:
        for i in range(3):
            cache.put(f"amplify-{i:032x}", {"text": "a"})
        cache.put("prefilter-" + "0" * 32, {"text": "p"})
    first = {"prefilter": "p1", "amplify": "a1"}
    assert note_prompt_changes(cfg, out, first) == []  # the folder's first run: nothing to say
    assert json.loads((out / PROMPTS_FILE).read_text()) == first
    assert note_prompt_changes(cfg, out, first) == []  # same prompts: the cache applies
    (line,) = note_prompt_changes(cfg, out, {"prefilter": "p1", "amplify": "a2"})
    assert line.startswith("the amplify prompts changed since this folder's last run")
    assert "its 3 cached amplify answers no longer apply" in line
    assert json.loads((out / PROMPTS_FILE).read_text())["amplify"] == "a2"


def test_the_fingerprint_of_a_stage_follows_its_policy(tmp_path: Path) -> None:
    from factory.engine.prompts import prompt_fingerprints

    policy = tmp_path / "policy.md"
    policy.write_text("# Policy\n\nBe kind.\n")
    recipe = ROOT / "pipelines" / "airline.yaml"
    before = prompt_fingerprints(load_recipe(recipe, [f"domain.policy={policy}"]))
    assert set(before) == {"prefilter", "amplify"}
    policy.write_text("# Policy\n\nBe kind, and brief.\n")
    after = prompt_fingerprints(load_recipe(recipe, [f"domain.policy={policy}"]))
    assert before["amplify"] != after["amplify"] and before["prefilter"] != after["prefilter"]
    other_model = prompt_fingerprints(
        load_recipe(recipe, [f"domain.policy={policy}", "llm.model=x"])
    )
    assert other_model["amplify"] != after["amplify"]
    assert prompt_fingerprints(load_recipe(ROOT / "pipelines" / "airline-envsim.yaml")) == {}
