"""Train/eval splits: stable everywhere, and leakage caught by id and by content."""

from __future__ import annotations

import random

import pytest

from softprobe.gym import LeakageError, SplitError, assert_no_leakage, partition_train_eval


def test_section_4_as_written():
    split = partition_train_eval(["ep-1", "ep-2", "ep-3", "ep-4"], train_ratio=0.75, seed=7)
    train, eval_ids = split.train, split.eval        # also unpacks: train, eval_ids = split
    assert_no_leakage(train, eval_ids)               # raises LeakageError if an id is in both
    assert tuple(split) == (train, eval_ids)
    assert len(train) == 3 and len(eval_ids) == 1


@pytest.mark.parametrize(
    "ids, ratio, seed, train, eval_ids",
    [
        (["a", "b", "c", "d", "e"], 0.6, 1, ["d", "a", "e"], ["b", "c"]),
        (
            [f"task-{i:02d}" for i in range(10)], 0.7, 42,
            ["task-08", "task-09", "task-02", "task-05", "task-01", "task-04", "task-03"],
            ["task-00", "task-06", "task-07"],
        ),
    ],
)
def test_the_split_is_pinned_so_an_algorithm_change_is_caught(ids, ratio, seed, train, eval_ids):
    split = partition_train_eval(ids, train_ratio=ratio, seed=seed)
    assert (split.train, split.eval) == (train, eval_ids)


def test_the_input_order_and_global_random_state_do_not_matter():
    ids = [f"id-{i}" for i in range(200)]
    shuffled = ids[:]
    random.Random(3).shuffle(shuffled)
    random.seed(12345)
    assert partition_train_eval(ids, seed="s") == partition_train_eval(shuffled, seed="s")
    assert partition_train_eval(ids, seed=1) != partition_train_eval(ids, seed=2)


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.75, 0.9, 0.999])
def test_ratios_on_1000_ids(ratio):
    split = partition_train_eval([f"ep-{i}" for i in range(1000)], train_ratio=ratio, seed=7)
    assert len(split.train) == min(999, round(1000 * ratio + 1e-9))
    assert len(split.train) + len(split.eval) == 1000
    assert not set(split.train) & set(split.eval)


def test_tiny_inputs_keep_both_sides_non_empty():
    assert partition_train_eval(["a", "b"], train_ratio=0.99, seed=0).eval != []
    assert partition_train_eval(["a", "b"], train_ratio=0.01, seed=0).train != []
    assert partition_train_eval(["only"], train_ratio=0.5, seed=0).train == ["only"]
    assert partition_train_eval([], train_ratio=0.5).train == []


@pytest.mark.parametrize(
    "ids, ratio, message",
    [
        (["a", "a", "b"], 0.5, "repeated: a"),
        (["a", ""], 0.5, "non-empty strings"),
        (["a", 3], 0.5, "non-empty strings"),
        (["a", "b"], 0.0, "strictly between"),
        (["a", "b"], 1.0, "strictly between"),
        (["a", "b"], True, "strictly between"),
    ],
)
def test_bad_input_is_a_typed_error(ids, ratio, message):
    with pytest.raises(SplitError, match=message):
        partition_train_eval(ids, train_ratio=ratio)


def test_leakage_by_id_names_the_ids():
    with pytest.raises(LeakageError, match="2 ids are in both train and eval: ep-2, ep-3"):
        assert_no_leakage(["ep-1", "ep-2", "ep-3"], ["ep-3", "ep-2", "ep-4"])


def test_leakage_by_fingerprint_catches_one_task_under_two_ids():
    prints = {"ep-1": "h1", "ep-2": "h2", "ep-9": "h1"}
    assert_no_leakage(["ep-1"], ["ep-2"], fingerprints=prints)
    with pytest.raises(LeakageError, match=r"ep-1 \(train\) = ep-9 \(eval\)"):
        assert_no_leakage(["ep-1", "ep-2"], ["ep-9"], fingerprints=prints)
    with pytest.raises(SplitError, match="no fingerprint for 1 ids: ep-5"):
        assert_no_leakage(["ep-1"], ["ep-5"], fingerprints=prints)
