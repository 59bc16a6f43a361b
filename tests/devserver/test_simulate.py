"""The dev server's simulated model without HTTP: prompt kinds, verdicts, amplification, defects."""

from __future__ import annotations

import copy
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factory.core.trajectory import Turn
from factory.devserver import simulate
from factory.devserver.simulate import (
    AMPLIFY_MARKER,
    JUDGE_MARKER,
    amplify,
    break_json,
    compile_reference,
    extract_block,
    inject_defect,
    judge,
    prompt_kind,
    reference_from_block,
    vary_opening,
)
from factory.envs.airline.lookups import PLACES
from tests.helpers import make_reference


def prompt(marker: str, body: Any) -> list[dict[str, Any]]:
    text = f"Instructions.\n\n{marker}\n```json\n{json.dumps(body)}\n```\nAnswer with JSON."
    return [{"role": "system", "content": "You are careful."}, {"role": "user", "content": text}]


# --- prompt recognition -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("messages", "kind"),
    [
        (prompt(AMPLIFY_MARKER, {"messages": []}), "amplify"),
        (prompt(JUDGE_MARKER, {"messages": []}), "judge"),
        ([{"role": "user", "content": "Say hello."}], "other"),
        (
            [{"role": "user", "content": [{"type": "text", "text": f"x\n{JUDGE_MARKER}\n"}]}],
            "judge",
        ),
        # only the last user message counts; a marker in the system prompt is not a request
        (
            [{"role": "system", "content": AMPLIFY_MARKER}, {"role": "user", "content": "hi"}],
            "other",
        ),
        ([*prompt(AMPLIFY_MARKER, {}), {"role": "user", "content": "and now?"}], "other"),
        ([], "other"),
    ],
)
def test_prompt_kind(messages: list[dict[str, Any]], kind: str) -> None:
    assert prompt_kind(messages) == kind


def test_extract_block_reads_the_fenced_json_after_the_marker() -> None:
    text = prompt(AMPLIFY_MARKER, {"messages": [{"role": "user", "content": "a\n```b"}]})[1][
        "content"
    ]
    block = extract_block(text, AMPLIFY_MARKER)
    assert block is not None
    assert json.loads(block) == {"messages": [{"role": "user", "content": "a\n```b"}]}
    assert extract_block("no marker here", AMPLIFY_MARKER) is None
    assert extract_block(f"{AMPLIFY_MARKER}\n```json\n{{unterminated", AMPLIFY_MARKER) is None


@pytest.mark.parametrize("block", ["{not json", "[1, 2", '{"turns": []}', '"text"'])
def test_reference_from_block_rejects_what_is_not_a_trajectory(block: str) -> None:
    assert reference_from_block(block) is None


# --- judge ------------------------------------------------------------------------------
def test_judge_keeps_a_sound_trajectory() -> None:
    verdict = judge(make_reference())
    assert verdict["keep"] is True
    assert verdict["scores"] == {"completeness": 5, "consistency": 5, "format": 5}
    assert verdict["reasons"]


def _drop_message(index: int) -> dict[str, Any]:
    ref = make_reference()
    del ref["messages"][index]
    return ref


def _bad_args() -> dict[str, Any]:
    ref = make_reference()
    ref["messages"][3]["tool_calls"][0]["arguments"] = "user_id=mia"
    return ref


@pytest.mark.parametrize(
    ("reference", "reason"),
    [
        ({"messages": []}, "empty"),
        ({"turns": "x"}, "empty"),
        (None, "empty"),
        (_drop_message(4), "no observation"),  # get_user_details answered by nothing
        (_drop_message(3), "without a call"),  # observation answers nothing
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "no user"),
        (_bad_args(), "object arguments"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "role"),
    ],
)
def test_judge_rejects_structurally_broken_trajectories(reference: Any, reason: str) -> None:
    verdict = judge(reference)
    assert verdict["keep"] is False
    assert any(reason in r for r in verdict["reasons"]), verdict["reasons"]
    assert all(1 <= s <= 5 for s in verdict["scores"].values())
    assert set(verdict["scores"]) == {"completeness", "consistency", "format"}


# --- amplify ----------------------------------------------------------------------------
def _tool_json(messages: list[dict[str, Any]], name: str) -> Any:
    return json.loads(next(m["content"] for m in messages if m.get("name") == name))


def _calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for m in messages for c in m.get("tool_calls", [])]


def _shape(value: str) -> str:
    return re.sub(r"[A-Z]", "A", re.sub(r"[a-z]", "a", re.sub(r"\d", "9", value)))


@pytest.mark.parametrize("seed", range(5))
def test_amplify_renames_consistently_and_keeps_structure(seed: int) -> None:
    ref = make_reference()
    out = amplify(ref, random.Random(seed))["messages"]
    old = ref["messages"]
    assert [m["role"] for m in out] == [m["role"] for m in old]
    assert [c["name"] for c in _calls(out)] == [c["name"] for c in _calls(old)]
    for new_call, old_call in zip(_calls(out), _calls(old), strict=True):
        assert {k: type(v) for k, v in new_call["arguments"].items()} == {
            k: type(v) for k, v in old_call["arguments"].items()
        }
    text = json.dumps(out)
    for original in (
        "mia_li_3668",
        "ZFA04Y",
        "VAAOXJ",
        "credit_card_4421486",
        "HAT069",
        "Mia",
        "Amelia",
        "Ahmed",
        "mia.li3818",
        "7447",
        "JFK",
        "SEA",
        "New York",
        "Seattle",
    ):
        assert not re.search(rf"(?<!\w){re.escape(original)}(?!\w)", text), original

    profile = _tool_json(out, "get_user_details")
    first, last = profile["name"]["first_name"], profile["name"]["last_name"]
    user_id = profile["user_id"]
    assert re.fullmatch(rf"{first.lower()}_{last.lower()}_\d{{4}}", user_id)
    assert re.fullmatch(rf"{first.lower()}\.{last.lower()}\d{{4}}@example\.com", profile["email"])
    card = next(iter(profile["payment_methods"]))
    assert re.fullmatch(r"credit_card_\d{7}", card)
    assert [_shape(r) for r in profile["reservations"]] == [_shape("ZFA04Y"), _shape("VAAOXJ")]
    # the same mapping everywhere: user text, arguments, observations, reasoning, final answer
    assert (
        out[2]["content"] == f"It's {user_id}, and my reservation is {profile['reservations'][0]}."
    )
    assert out[3]["tool_calls"][0]["arguments"] == {"user_id": user_id}
    assert out[3]["reasoning"] == f"Look up {user_id} first."
    booking = out[7]["tool_calls"][0]["arguments"]
    assert booking["user_id"] == user_id
    assert booking["payment_methods"][0]["payment_id"] == card
    assert booking["payment_methods"][0]["amount"] == 121
    flight = _tool_json(out, "search_direct_flight")[0]
    assert booking["flights"][0]["flight_number"] == flight["flight_number"]
    assert re.fullmatch(r"HAT\d{3}", flight["flight_number"])
    origin, dest = flight["origin"], flight["destination"]
    assert out[5]["tool_calls"][0]["arguments"]["origin"] == origin
    city_from, city_to = PLACES[origin], PLACES[dest]
    assert f"from {city_from} to {city_to} on May " in out[0]["content"]
    day = int(flight["date"][-2:])
    assert flight["date"][:8] == "2024-05-"
    assert re.search(rf"May {day}(st|nd|rd|th)\.", out[0]["content"])
    reservation = json.loads(out[8]["content"])["reservation_id"]
    assert reservation == profile["reservations"][1]
    assert out[9]["content"].startswith(f"Booked {reservation} for {first} {last}: ")
    assert f"ending {profile['payment_methods'][card]['last_four']};" in out[9]["content"]
    assert profile["email"] in out[9]["content"]
    # the output parses as canonical turns
    assert [Turn.from_dict(m).role for m in out] == [m["role"] for m in out]


def test_amplify_is_deterministic_per_seed_and_varies_across_seeds() -> None:
    ref = compile_reference(make_reference())
    runs = [json.dumps(amplify(ref, random.Random(s))) for s in (1, 1, 2)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert amplify(make_reference(), random.Random(1)) == amplify(ref, random.Random(1))


def test_amplify_does_not_touch_the_reference() -> None:
    ref = make_reference()
    before = copy.deepcopy(ref)
    amplify(ref, random.Random(0))
    assert ref == before


def test_amplify_reads_openai_style_calls() -> None:
    ref = make_reference()
    call = ref["messages"][3]["tool_calls"][0]
    ref["messages"][3]["tool_calls"] = [
        {"id": "c1", "type": "function",
         "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}
    ]  # fmt: skip
    out = amplify(ref, random.Random(0))["messages"]
    assert out[3]["tool_calls"][0]["name"] == "get_user_details"
    assert out[3]["tool_calls"][0]["arguments"]["user_id"] != "mia_li_3668"


@pytest.mark.parametrize(
    "line",
    [
        "Hi! I'm looking to book a flight from New York to Seattle on May 20th.",
        "Hello, could you help me cancel reservation ZFA04Y?",
        "Can you change my seat?",
        "I need to add a bag.",
        "My flight got cancelled.",
    ],
)
def test_vary_opening_rewords_but_keeps_the_facts(line: str) -> None:
    words = {w for w in re.findall(r"[A-Z0-9]{2,}\w*|\d+\w*", line)}
    variants = {vary_opening(line, random.Random(s)) for s in range(8)}
    assert line not in variants
    assert len(variants) > 1
    for variant in variants:
        assert words <= set(re.findall(r"[A-Z0-9]{2,}\w*|\d+\w*", variant))


def test_amplify_is_fast_on_a_long_reference() -> None:
    ref = make_reference()
    ref["messages"] = ref["messages"][:-1] * 3 + ref["messages"][-1:]  # 28 turns
    compiled = compile_reference(ref)
    start = time.perf_counter()
    for seed in range(50):
        amplify(compiled, random.Random(seed))
    assert (time.perf_counter() - start) / 50 < 0.005  # ~0.1 ms here; generous for a busy box


@pytest.mark.shared
@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_amplify_on_taubench_stays_valid_against_the_tool_schemas(taubench_dir: Path) -> None:
    tools = {t["name"]: t["parameters"] for t in _bare_tools(taubench_dir / "tools.json")}
    episodes = json.loads((taubench_dir / "gpt-4o-airline.json").read_text())
    for n, episode in enumerate(episodes):
        ref = _output_format(episode["traj"])
        compiled = compile_reference(ref)
        out = amplify(compiled, random.Random(n))
        text = json.dumps(out)
        for ident in compiled.ids | set(compiled.first_names) | set(compiled.last_names):
            assert not re.search(rf"(?<!\w){re.escape(ident)}(?!\w)", text), (n, ident)
        assert [m["role"] for m in out["messages"]] == [m["role"] for m in ref["messages"]]
        for call in _calls(out["messages"]):
            if call["name"] in tools:
                jsonschema.validate(call["arguments"], tools[call["name"]])


def _bare_tools(path: Path) -> list[dict[str, Any]]:
    return [t.get("function", t) for t in json.loads(path.read_text())]


def _output_format(traj: list[dict[str, Any]]) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    for m in traj:
        if m["role"] == "tool":
            out.append({"role": "tool", "name": m["name"], "content": m["content"]})
        elif m["role"] in ("user", "assistant"):
            msg = {"role": m["role"], "content": m.get("content") or ""}
            if m.get("tool_calls"):
                msg["tool_calls"] = [
                    {
                        "name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    }
                    for c in m["tool_calls"]
                ]
            out.append(msg)
    return {"messages": out}


# --- defects ----------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(
    value=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=8), min_size=1),
    seed=st.integers(0, 2**32),
)
def test_break_json_always_breaks(value: dict[str, Any], seed: int) -> None:
    broken, finish = break_json(json.dumps(value), random.Random(seed))
    assert finish in ("length", "stop")
    with pytest.raises(ValueError):
        json.loads(broken)


def test_break_json_keeps_a_fence_when_it_does_not_truncate() -> None:
    fenced = "```json\n" + json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n```"
    for seed in range(20):
        broken, finish = break_json(fenced, random.Random(seed))
        if finish == "stop":
            assert broken.startswith("```json\n") and broken.endswith("\n```")
            with pytest.raises(ValueError):
                json.loads(broken[8:-4])
        else:
            assert fenced.startswith(broken) and broken != fenced


@pytest.mark.parametrize("seed", range(3))
def test_inject_unknown_tool(seed: int) -> None:
    traj = amplify(make_reference(), random.Random(seed))
    avoid = "tools: get_user_details search_direct_flight book_reservation search_hotels"
    assert inject_defect(traj, "unknown_tool", random.Random(seed), avoid=avoid)
    names = [c["name"] for c in _calls(traj["messages"])]
    unknown = [n for n in names if n not in avoid]
    assert len(unknown) == 1
    # its observation still follows it, under the same (unknown) name
    assert unknown[0] in [m.get("name") for m in traj["messages"] if m["role"] == "tool"]


@pytest.mark.parametrize("seed", range(3))
def test_inject_wrong_arg_type(seed: int) -> None:
    traj = amplify(make_reference(), random.Random(seed))
    before = [{k: type(v) for k, v in c["arguments"].items()} for c in _calls(traj["messages"])]
    assert inject_defect(traj, "wrong_arg_type", random.Random(seed))
    after = [{k: type(v) for k, v in c["arguments"].items()} for c in _calls(traj["messages"])]
    changed = [k for b, a in zip(before, after, strict=True) for k in b if b[k] is not a[k]]
    assert len(changed) == 1


@pytest.mark.parametrize("seed", range(3))
def test_inject_missing_observation(seed: int) -> None:
    traj = amplify(make_reference(), random.Random(seed))
    assert inject_defect(traj, "missing_observation", random.Random(seed))
    verdict = judge(traj)
    assert not verdict["keep"]
    assert any("no observation" in r for r in verdict["reasons"])


@pytest.mark.parametrize("defect", ["unknown_tool", "wrong_arg_type", "missing_observation"])
def test_inject_defect_needs_a_call(defect: str) -> None:
    traj = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    }
    assert inject_defect(traj, defect, random.Random(0)) is False


def test_inject_defect_rejects_other_names() -> None:
    with pytest.raises(ValueError, match="rate_limit"):
        inject_defect(amplify(make_reference(), random.Random(0)), "rate_limit", random.Random(0))


def test_answer_other_is_short_plain_text() -> None:
    answer = simulate.answer_other([{"role": "user", "content": "What is 2 + 2? " * 20}])
    assert len(answer) < 160
    with pytest.raises(ValueError):
        json.loads(answer)


# --- simulate prompts: a perfect simulator ------------------------------------------------
def _world_call(tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(slice before, observation, full state after) of one call on a small generated world."""
    from factory.envs.airline import AirlineEnv
    from factory.envs.airline.slices import slice_for
    from factory.envs.airline.world import generate_world

    env = AirlineEnv(generate_world(5, n_users=6, n_flights=12, n_reservations=8))
    before = slice_for(env.state, tool, arguments)
    return before, env.execute(tool, arguments), env.state


def _sim_messages(state: Any, tool: str, arguments: Any, code: str | None = None) -> list[Any]:
    from factory.envsim.simulator import simulation_messages

    sample = {"tool": tool, "arguments": arguments, "state_before": state}
    return simulation_messages(sample, {"name": tool, "parameters": {}}, code)


def _first_reservation() -> str:
    from factory.envs.airline.world import generate_world

    world = generate_world(5, n_users=6, n_flights=12, n_reservations=8)
    return next(iter(world["reservations"]))


def test_simulate_prompts_are_recognised() -> None:
    messages = _sim_messages({"users": {}, "flights": {}, "reservations": {}}, "think", {})
    assert prompt_kind(messages) == "simulate"
    assert simulate.SIM_MARKER == "### Tool call to simulate"


@pytest.mark.parametrize("code", [None, "def cancel_reservation(data, reservation_id):\n    ..."])
def test_simulate_call_executes_on_the_slice_like_the_full_world(code: str | None) -> None:
    from factory.core.delta import apply
    from factory.envs.airline.slices import project

    args = {"reservation_id": _first_reservation()}
    before, observation, full_after = _world_call("cancel_reservation", args)
    untouched = copy.deepcopy(before)
    text = simulate.last_user_text(_sim_messages(before, "cancel_reservation", args, code))
    read = simulate.read_simulation(text)
    assert read == (before, "cancel_reservation", args)
    answer = simulate.simulate_call(*read)
    assert answer is not None
    assert answer["feedback"] == observation
    assert {op["op"] for op in answer["config_changes"]} == {"add", "replace"}
    after = apply(answer["config_changes"], before)
    assert after == project(full_after, like=after)
    assert before == untouched  # the prompt's state is not modified


def _sim_text(state: str, call: str) -> str:
    return f"### State\n```json\n{state}\n```\n\n{simulate.SIM_MARKER}\n```json\n{call}\n```"


@pytest.mark.parametrize(
    "text",
    [
        "no markers at all",
        f"### State\n```json\n{{}}\n```\n\n{simulate.SIM_MARKER}\nno fence",
        f'{simulate.SIM_MARKER}\n```json\n{{"name": "think"}}\n```',  # no state block
        _sim_text("{not json", '{"name": "x"}'),
        _sim_text("[]", '{"name": "x"}'),  # a state that is not an object
        _sim_text("{}", '{"arguments": {}}'),  # a call without a name
        _sim_text("{}", '["think", {}]'),
    ],
)
def test_read_simulation_refuses_unreadable_prompts(text: str) -> None:
    assert simulate.read_simulation(text) is None


def test_simulate_call_needs_an_airline_state() -> None:
    assert simulate.simulate_call({"users": {}}, "think", {}) is None
    failed = simulate.simulate_call({"users": {}, "flights": {}, "reservations": {}}, "nope", {})
    assert failed == {"feedback": "Error: unknown tool 'nope'", "config_changes": []}


def test_drop_change_removes_one_op() -> None:
    ops = [{"op": "add", "path": f"/{i}", "after": i} for i in range(3)]
    answer = {"feedback": "", "config_changes": list(ops)}
    assert simulate.drop_change(answer, random.Random(1)) is True
    assert len(answer["config_changes"]) == 2 and all(o in ops for o in answer["config_changes"])
    empty: dict[str, Any] = {"feedback": "", "config_changes": []}
    assert simulate.drop_change(empty, random.Random(1)) is False


def test_sim_drop_change_is_a_checked_rate_and_a_cli_flag() -> None:
    from factory.devserver import DevServerConfig
    from factory.devserver.__main__ import build_parser, config_from_args
    from factory.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        DevServerConfig(sim_drop_change=1.5)
    assert info.value.key_path == "devserver.sim_drop_change"
    args = build_parser().parse_args(["--sim-drop-change", "0.25"])
    assert config_from_args(args).sim_drop_change == 0.25
    assert DevServerConfig().sim_drop_change == 0.0


def test_sim_drop_change_is_deterministic_per_request() -> None:
    from factory.devserver.app import DevServerConfig, _simulation, _State

    args = {"reservation_id": _first_reservation()}
    before, _, _ = _world_call("cancel_reservation", args)
    text = simulate.last_user_text(_sim_messages(before, "cancel_reservation", args))
    read = simulate.read_simulation(text)
    assert read is not None
    full = simulate.simulate_call(*read)
    assert full is not None and len(full["config_changes"]) == 2

    def answer(rate: float, digest: bytes, seed: int = 0) -> tuple[Any, bool]:
        return _simulation(
            "simulate", text, _State(DevServerConfig(sim_drop_change=rate, seed=seed)), digest
        )

    assert answer(0.0, b"a") == (full, False)
    dropped, flag = answer(1.0, b"a")
    assert flag and len(dropped["config_changes"]) == 1
    assert dropped["config_changes"][0] in full["config_changes"]
    assert answer(1.0, b"a") == (dropped, True)  # same body, same answer
    draws = [answer(0.5, bytes([i]))[1] for i in range(40)]
    assert 5 < sum(draws) < 35


# --- grounded amplification: episodes executed on the prompt's environment state ------------
def _scenario(index: int = 0) -> dict[str, Any]:
    from factory.envsim.grounding import GroundingWorld

    world = GroundingWorld("airline", 5, {"n_users": 20, "n_flights": 40, "n_reservations": 60})
    return world.scenario(index, 0)


def _grounded_text(scenario: Any) -> str:
    from factory.envsim.grounding import ENV_STATE_MARKER

    state = scenario if isinstance(scenario, str) else json.dumps(scenario)
    ref = json.dumps(make_reference())
    return f"{ENV_STATE_MARKER}\n```json\n{state}\n```\n\n{AMPLIFY_MARKER}\n```json\n{ref}\n```"


def test_read_scenario_takes_the_environment_block() -> None:
    from factory.devserver.grounded import read_scenario

    scenario = _scenario()
    assert read_scenario(_grounded_text(scenario)) == scenario
    assert read_scenario(f"{AMPLIFY_MARKER}\n```json\n{{}}\n```") is None


@pytest.mark.parametrize(
    "state",
    [
        "{not json",
        "[]",
        '{"users": {}, "flights": {}, "reservations": {}}',  # nobody to talk about
        '{"users": {"a_b_1": {}}, "flights": {}}',  # a table missing
        '{"users": {"a_b_1": 3}, "flights": {}, "reservations": {}}',
    ],
)
def test_read_scenario_refuses_what_no_domain_runs_on(state: str) -> None:
    from factory.devserver.grounded import read_scenario

    assert read_scenario(_grounded_text(state)) is None


def _reference() -> list[dict[str, Any]]:
    return simulate.reference_messages(compile_reference(make_reference()))


@pytest.mark.slow  # seconds of CPU or waiting: the full suite runs it, not the fast loop
def test_grounded_trajectory_plays_the_references_booking_on_the_state() -> None:
    """The reference books a flight it searched; on each scenario the answer searches the
    scenario's routes and books what it found, every call executed there (the reference
    leaves arguments out: they are completed from the tool's schema and the state)."""
    from factory.core.labels import is_error_observation
    from factory.devserver.grounded import grounded_trajectory
    from factory.envs.airline import AirlineEnv

    booked = 0
    for index in range(8):
        scenario = _scenario(index)
        untouched = copy.deepcopy(scenario)
        out = grounded_trajectory(scenario, _reference(), random.Random(index))
        assert out is not None and scenario == untouched
        messages = out["messages"]
        assert messages[0]["role"] == "user" and messages[-1]["role"] == "assistant"
        calls = _calls(messages)
        assert calls[0] == {
            "name": "get_user_details",
            "arguments": {"user_id": _subject(scenario)},
        }
        booked += calls[-1]["name"] == "book_reservation"
        env = AirlineEnv(copy.deepcopy(scenario))
        observations = [m["content"] for m in messages if m["role"] == "tool"]
        assert observations == [env.execute(c["name"], c["arguments"]) for c in calls]
        assert not any(is_error_observation(o) for o in observations)
    assert booked >= 6  # 7 of 8: one scenario's routes have no flight left to book


def _subject(scenario: dict[str, Any]) -> str:
    return next(iter(scenario["users"]))


def test_grounded_trajectory_needs_a_state_a_domain_runs_on() -> None:
    from factory.devserver.grounded import grounded_trajectory

    reference = _reference()
    assert grounded_trajectory({"users": {"x_y_1": {}}}, reference, random.Random(0)) is None
    assert (
        grounded_trajectory(
            {"users": {}, "flights": {}, "reservations": {}}, reference, random.Random(0)
        )
        is None
    )
    # An inconsistent state gets only what its world answers: the user's profile.
    inconsistent = {"users": {"x_y_1": {"reservations": ["ABCDEF"]}}, "flights": {}}
    inconsistent["reservations"] = {"ABCDEF": {"status": None}}
    out = grounded_trajectory(inconsistent, reference, random.Random(0))
    assert out is not None
    assert [c["name"] for c in _calls(out["messages"])] == ["get_user_details"]


def test_corrupt_observation_changes_one_value() -> None:
    from factory.devserver.grounded import corrupt_observation, grounded_trajectory

    for seed in range(20):
        out = grounded_trajectory(_scenario(seed), _reference(), random.Random(seed))
        assert out is not None
        before = copy.deepcopy(out)
        assert corrupt_observation(out, random.Random(seed))
        changed = [
            (a["content"], b["content"])
            for a, b in zip(before["messages"], out["messages"], strict=True)
            if a != b
        ]
        assert len(changed) == 1
        old, new = (json.loads(text) for text in changed[0])
        flat_old, flat_new = _flatten(old), _flatten(new)
        assert flat_old.keys() == flat_new.keys()
        diffs = [k for k in flat_old if flat_old[k] != flat_new[k]]
        assert len(diffs) == 1 and type(flat_old[diffs[0]]) is type(flat_new[diffs[0]])


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)  # type: ignore[assignment]
    else:
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(_flatten(v, f"{prefix}/{k}"))
    return out


def test_corrupt_observation_without_values_changes_the_text() -> None:
    from factory.devserver.grounded import corrupt_observation

    plain = {"messages": [{"role": "tool", "name": "think", "content": ""}]}
    assert corrupt_observation(plain, random.Random(0))
    assert plain["messages"][0]["content"].strip() != ""
    assert not corrupt_observation(
        {"messages": [{"role": "user", "content": "hi"}]}, random.Random(0)
    )


def test_wrong_observation_is_a_checked_rate_and_a_cli_flag() -> None:
    from factory.devserver import DevServerConfig
    from factory.devserver.__main__ import build_parser, config_from_args
    from factory.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        DevServerConfig(wrong_observation=-0.1)
    assert info.value.key_path == "devserver.wrong_observation"
    args = build_parser().parse_args(["--wrong-observation", "0.3"])
    assert config_from_args(args).wrong_observation == 0.3
    assert DevServerConfig().wrong_observation == 0.0


def test_grounded_answers_and_wrong_observations_are_deterministic_per_request() -> None:
    from factory.devserver.app import DevServerConfig, _amplification, _State

    text = _grounded_text(_scenario(3))
    ref = reference_from_block(json.dumps(make_reference()))
    assert ref is not None

    def answer(rate: float, digest: bytes) -> tuple[dict[str, Any], list[str]]:
        events: list[str] = []
        state = _State(DevServerConfig(wrong_observation=rate))
        out = _amplification(text, ref, state, digest, random.Random(digest), events)
        return out, events

    clean, events = answer(0.0, b"a")
    assert events == ["grounded_answers"]
    wrong, events = answer(1.0, b"a")
    assert events == ["grounded_answers", "wrong_observations"] and wrong != clean
    assert answer(1.0, b"a") == (wrong, events)
    draws = ["wrong_observations" in answer(0.5, bytes([i]))[1] for i in range(40)]
    assert 5 < sum(draws) < 35
    # Without an environment block the answer is the renamed reference, not counted as grounded.
    events = []
    plain_text = f"{AMPLIFY_MARKER}\n```json\n{{}}\n```"
    plain = _amplification(
        plain_text, ref, _State(DevServerConfig()), b"a", random.Random(0), events
    )
    assert events == []
    assert [c["name"] for c in _calls(plain["messages"])] == [
        c["name"] for c in _calls(make_reference()["messages"])
    ]
