"""The console: ETA from the phase's rate, Ray's noise in the run log, errors from Ray."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from factory.engine.console import (
    PhaseRate,
    ProgressBar,
    console,
    expected_error,
    quiet_ray,
    top_reasons,
)
from factory.errors import EXIT_CONFIG, EXIT_INPUT, ConfigError, SeedError


def test_no_eta_before_enough_rows_then_the_rate_since_the_first_completion() -> None:
    rate = PhaseRate(min_rows=8, min_seconds=5.0)
    # Actors start for 100 s; then 64 rows arrive at once, then 2 rows/s.
    assert rate.eta_s(1000, now=50.0) is None
    rate.observe(64, now=100.0)
    assert rate.eta_s(936, now=100.0) is None, "one burst is no rate"
    for i in range(1, 4):
        rate.observe(64 + 2 * i, now=100.0 + i)
    assert rate.eta_s(930, now=103.0) is None, "6 rows are not enough"
    for i in range(4, 11):
        rate.observe(64 + 2 * i, now=100.0 + i)
    # 20 rows in 10 s since the first completion: 2 rows/s, not 84 rows / 110 s.
    assert rate.rate(now=110.0) == pytest.approx(2.0)
    assert rate.eta_s(916, now=110.0) == pytest.approx(458.0)


def test_a_new_phase_counts_from_its_own_first_completion() -> None:
    rate = PhaseRate(min_rows=2, min_seconds=1.0)
    for t in range(10):
        rate.observe(10 * t, now=float(t))
    assert rate.rate(now=9.0) == pytest.approx(10.0)
    rate.new_phase(90)
    rate.observe(90, now=100.0)  # the next round's actors are starting: nothing new
    assert rate.rate(now=130.0) is None
    rate.observe(95, now=130.0)
    rate.observe(99, now=131.0)
    rate.observe(101, now=132.0)
    assert rate.rate(now=132.0) == pytest.approx(6 / 2.0)


def test_bar_shows_no_eta_until_the_rate_is_known() -> None:
    out = io.StringIO()
    with ProgressBar(total=1000, desc="accepted", unit="row", file=out, mininterval=0) as bar:
        bar.update(1)
        first = out.getvalue().split("\r")[-1]
        bar.phase_rate.first = (bar.phase_rate.first[0] - 60.0, 1)  # as if 60 s ago
        bar.update(29)
        last = out.getvalue().split("\r")[-1]
    assert "<?," in first and "?row/s" in first, first
    assert "<?," not in last and "row/s" in last, last
    eta = last.split("<", 1)[1].split(",", 1)[0]
    minutes, seconds = (int(x) for x in eta.split(":")[-2:])
    assert 30 * 60 < minutes * 60 + seconds < 35 * 60  # 970 rows at ~0.48 rows/s


def test_top_reasons_rank_and_give_one_example_each() -> None:
    lines = top_reasons(
        {"parse:invalid_json": 1, "validate:unknown_tool": 3},
        {
            "parse:invalid_json": ("s.jsonl:4", "Expecting value:\nline 1"),
            "validate:unknown_tool": ("s.jsonl:0", "tool 'x' is not in the tool list"),
        },
    )
    assert lines == [
        "validate:unknown_tool x3, e.g. s.jsonl:0: tool 'x' is not in the tool list",
        "parse:invalid_json x1, e.g. s.jsonl:4: Expecting value: line 1",
    ]


def test_quiet_ray_sends_fd2_to_the_run_log_and_keeps_the_console(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with quiet_ray(tmp_path) as log:
        os.write(2, b"C++ core: raylet noise\n")
        print("python noise on sys.stderr", file=sys.stderr)
        print("factory line", file=console())
    print("after", file=sys.stderr)
    err = capfd.readouterr().err
    assert "factory line" in err and "after" in err
    assert "noise" not in err
    text = log.read_text()
    assert log == tmp_path / "logs" / "run.log"
    assert "raylet noise" in text and "python noise" in text and "factory line" not in text


def test_the_run_log_has_no_colour_codes_and_the_terminal_keeps_them(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # Ray's forwarded worker lines, as its print_worker_logs writes them (issue 39).
    forwarded = "\x1b[36m(WorkerActor pid=9259)\x1b[0m factory: a worker line"
    with quiet_ray(tmp_path) as log:
        print(forwarded, file=sys.stderr)
        sys.stderr.write("\x1b[1m\x1b[32mbold green\x1b[39m\x1b[22m\x1b[2K\n")
        print("\x1b[33mfactory line\x1b[0m", file=console())
    text = log.read_text()
    assert "(WorkerActor pid=9259) factory: a worker line\n" in text
    assert "bold green\n" in text and "\x1b" not in text
    assert "\x1b[33mfactory line\x1b[0m" in capfd.readouterr().err


@pytest.mark.ray
def test_expected_errors_come_back_from_ray_tasks_and_actors(ray_session) -> None:
    import ray.data

    def bad_task(batch):  # type: ignore[no-untyped-def]
        raise SeedError("no_seeds", "nothing usable in /x/seeds.jsonl")

    class BadActor:
        def __init__(self) -> None:
            raise ConfigError("unknown world size(s) n_userz", key_path="envsim.world_sizes")

        def __call__(self, batch):  # type: ignore[no-untyped-def]
            return batch

    with pytest.raises(Exception) as task_info:
        ray.data.range(2).map_batches(bad_task).materialize()
    actor = ray.data.ActorPoolStrategy(size=1)
    with pytest.raises(Exception) as actor_info:
        ray.data.range(2).map_batches(BadActor, compute=actor, num_cpus=0.25).materialize()
    assert expected_error(task_info.value) == ("nothing usable in /x/seeds.jsonl", EXIT_INPUT)
    assert expected_error(actor_info.value) == (
        "envsim.world_sizes: unknown world size(s) n_userz",
        EXIT_CONFIG,
    )
    assert expected_error(ValueError("factory.errors.SeedError: not from Ray")) is None


def test_without_a_terminal_each_bar_is_a_plain_line_now_and_then(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from factory.engine.console import Bars
    from factory.engine.loop import Bar

    bars = Bars(tty=False, every_s=3600)
    bars.show([Bar("seeds checked", 0, None)])
    bars.show([Bar("seeds checked", 5, None)])  # not due: nothing printed
    bars.show([Bar("seeds checked", 41, 41, {"kept": 40}, done=True)])  # done: printed
    bars.show([Bar("seeds checked", 41, 41, {"kept": 40}, done=True)])  # unchanged: not
    bars.show([Bar("accepted", 0, 60)])
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "seeds checked: 0",
        "seeds checked: 41/41 (100%), kept=40 (done)",
        "accepted: 0/60 (0%)",
    ]
    assert "\x1b" not in "".join(lines) and "\r" not in "".join(lines)


def test_on_a_terminal_each_bar_is_one_redrawn_line_in_the_order_it_appeared(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The tqdm side of ``Bars``: one bar per name, created in order, moved to each new
    count and total, its postfix shown, closed at the end."""
    from factory.engine.console import Bars
    from factory.engine.loop import Bar

    bars = Bars(tty=True)
    bars.show([Bar("judge", 0, None)])
    bars.show([Bar("judge", 41, 41, {"kept": 40}, done=True), Bar("accepted", 3, 60)])
    bars.show([Bar("judge", 41, 41, {"kept": 40}, done=True), Bar("accepted", 60, 60, done=True)])
    assert list(bars._bars) == ["judge", "accepted"]
    judge, accepted = bars._bars["judge"], bars._bars["accepted"]
    assert (judge.n, judge.total, accepted.n, accepted.total) == (41, 41, 60, 60)
    assert judge.postfix == "kept=40"
    bars.close()
    assert bars._bars == {}
    err = capsys.readouterr().err
    assert "judge" in err and "accepted" in err and "60/60" in err
