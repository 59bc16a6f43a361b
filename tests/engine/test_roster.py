"""Who holds which item (``factory.engine.roster``), without Ray: a starting worker takes
nothing, a lost worker's items go first to the survivors, room counts what waits, a late
answer of a lost worker is dropped."""

from __future__ import annotations

from factory.engine.roster import Roster, State
from factory.engine.work import Item, ItemResult


def items(*indexes: int) -> list[Item]:
    return [Item("s", k, "c") for k in indexes]


def result(k: int) -> ItemResult:
    return ItemResult("s", k, [{"status": "ok"}])


def started(roster: Roster, *numbers: int) -> Roster:
    for n in numbers:
        roster.members[n].state = State.READY
    return roster


def test_a_starting_worker_takes_nothing_and_items_wait_in_the_backlog() -> None:
    roster = Roster(2, capacity=3, replacements=0)
    assert roster.room() == 0
    assert roster.place(items(0, 1)) == {}
    assert [i.index for i in roster.backlog] == [0, 1] and roster.in_flight == 2
    started(roster, 1)
    assert roster.room() == 1  # three places, two already wait for them
    placed = roster.place([])
    assert {n: [i.index for i in got] for n, got in placed.items()} == {1: [0, 1]}
    assert roster.backlog == [] and roster.room() == 1


def test_items_go_to_the_least_loaded_ready_worker_up_to_its_capacity() -> None:
    roster = started(Roster(2, capacity=2, replacements=0), 0, 1)
    placed = roster.place(items(0, 1, 2, 3, 4))
    assert sorted(len(v) for v in placed.values()) == [2, 2]
    assert [i.index for i in roster.backlog] == [4]  # no place left: it waits
    assert roster.room() == 0


def test_a_lost_worker_s_items_go_first_to_the_survivors_and_a_new_one_starts() -> None:
    roster = started(Roster(3, capacity=4, replacements=1), 0, 1, 2)
    roster.place(items(*range(9)))
    held = sorted(roster.members[1].assigned)
    again, replaced = roster.lose(1)
    assert replaced and roster.members[1].state is State.STARTING
    assert roster.members[1].generation == 1 and roster.members[1].assigned == {}
    assert sorted(i.key for i in again) == held
    assert roster.in_flight == 9  # nothing forgotten
    assert roster.room() == 0  # 2 free places, 3 items waiting for them
    placed = roster.place(items(9))  # the lost items go out before item 9
    assert sorted(i.key for got in placed.values() for i in got) == [again[0].key, again[1].key]
    assert [i.key for i in roster.backlog] == [again[2].key, ("s", 9)]
    assert roster.in_flight == 10 and roster.room() == 0


def test_with_no_replacement_left_a_lost_worker_stays_lost_and_the_rest_go_on() -> None:
    roster = started(Roster(2, capacity=2, replacements=0), 0, 1)
    _, replaced = roster.lose(0)
    assert not replaced and roster.members[0].state is State.LOST
    assert roster.alive() and roster.counts() == (1, 2)
    roster.lose(1)
    assert not roster.alive()


def test_a_result_counts_only_from_the_worker_that_holds_its_item() -> None:
    roster = started(Roster(2, capacity=2, replacements=1), 0, 1)
    roster.place(items(0, 1))
    holder = next(m.number for m in roster.members if ("s", 0) in m.assigned)
    other = 1 - holder
    roster.lose(holder)  # its item 0 waits in the backlog for the other worker
    assert roster.answered(holder, [result(0)]) == []  # a late answer of the lost actor
    roster.place([])
    assert ("s", 0) in roster.members[other].assigned
    assert [r.index for r in roster.answered(other, [result(0)])] == [0]
    assert roster.answered(other, [result(0)]) == []  # and once only
    assert roster.holder([("s", 0)]) == {}
