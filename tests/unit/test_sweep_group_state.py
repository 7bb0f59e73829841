"""The sessions' freeze (the shim's ``stop_groups``) on a made-up process table: a process seen
stopped is not read thread by thread again while its main thread stays stopped, and the freeze
still ends only on a round that read every thread (a thread resumed alone is caught).

The table replaces the shim's readers of /proc (``_other_pids``, ``_proc_status``,
``_thread_states``) and its signaller; ``group_state`` and ``stop_groups`` run as they are."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable

import pytest

from softprobe.gym.shim.agent_shim import sweep

GID = 5000


class Table:
    """Processes of the session group ``GID``: each a list of thread states (the main thread's
    first). A process stops (every thread ``T``) at the SIGSTOP numbered ``stops_at`` of its own;
    ``events`` change the table at the start of a round (1 is the first)."""

    def __init__(self, threads: dict[int, list[str]], stops_at: dict[int, int],
                 events: dict[int, Callable[[Table], None]] | None = None) -> None:
        self.threads = threads
        self.stops_at = stops_at
        self.events = events or {}
        self.round = 0
        self.walks: Counter[int] = Counter()  # how often each process's threads were read
        self.stops: Counter[int] = Counter()  # SIGSTOPs sent to each

    def other_pids(self, me: int) -> list[int]:
        self.round += 1
        event = self.events.get(self.round)
        if event is not None:
            event(self)
        return sorted(self.threads)

    def status(self, pid: int) -> tuple[frozenset[int], str, int]:
        threads = self.threads[pid]
        return frozenset({GID}), threads[0], len(threads)

    def thread_states(self, pid: int) -> list[str]:
        self.walks[pid] += 1
        return list(self.threads[pid])

    def signal(self, pid: int, sig: int, keep: Callable[[frozenset[int]], bool]) -> None:
        assert sig == signal.SIGSTOP and keep(frozenset({GID}))
        self.stops[pid] += 1
        if self.stops[pid] >= self.stops_at[pid]:
            self.threads[pid] = ["T"] * len(self.threads[pid])

    def all_stopped(self) -> bool:
        return all(letter in ("T", "t") for threads in self.threads.values() for letter in threads)


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Table]:
    def install(*args: object, **kwargs: object) -> Table:
        made = Table(*args, **kwargs)
        monkeypatch.setattr(sweep, "_other_pids", made.other_pids)
        monkeypatch.setattr(sweep, "_proc_status", made.status)
        monkeypatch.setattr(sweep, "_thread_states", made.thread_states)
        monkeypatch.setattr(sweep, "_signal_pid", made.signal)
        return made

    return install


def test_a_process_seen_stopped_is_not_read_again_while_its_main_thread_stays_stopped(table) -> None:
    # 10 (four threads) stops at its first SIGSTOP; 11 holds out for six rounds.
    world = table({10: ["R", "S", "S", "R"], 11: ["R"]}, stops_at={10: 1, 11: 6})
    assert sweep.stop_groups(frozenset({GID}), deadline_s=30) == []
    assert world.all_stopped()
    assert world.stops == {10: 1, 11: 6}
    # 10's threads were read when it was first seen stopped (round 2) and on the round that ended
    # the freeze, not on each of the rounds 11 held out for (it was six times before).
    assert world.walks[10] == 2, world.walks
    assert world.round == 8  # 6 signalling 11, 7 finds it stopped, 8 reads every thread


def test_a_thread_resumed_alone_while_its_main_thread_stays_stopped_is_caught(table) -> None:
    def resume_one_thread(world: Table) -> None:
        # A tracer resumes one thread of 10 alone: its main thread stays in a trace stop.
        world.threads[10] = ["t", "R", "T"]

    world = table({10: ["R", "R", "R"], 11: ["R"]}, stops_at={10: 1, 11: 4}, events={3: resume_one_thread})
    assert sweep.stop_groups(frozenset({GID}), deadline_s=30) == []
    # The freeze did not end on 10's main thread's word: the round that read every thread again
    # found the resumed one and stopped 10 once more.
    assert world.stops[10] == 2, world.stops
    assert world.all_stopped(), world.threads
