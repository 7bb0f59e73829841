"""Train/eval splits that are stable everywhere, and a check that nothing leaks between them.

The split algorithm (stable across runs, machines and Python versions; ``random`` is not used):

1. each id gets the key ``sha256(f"{seed}:{id}")`` (UTF-8);
2. ids are sorted by that key (the seeded shuffle; the input order does not matter);
3. the first ``floor(n * train_ratio + 0.5)`` go to train, the rest to eval; with two or more
   ids, each side gets at least one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Mapping

from pydantic import BaseModel

from softprobe.gym.errors import LeakageError, SplitError


class TrainEvalSplit(BaseModel):
    """The two sides of a split; unpacks as ``train, eval_ids = split``."""

    train: list[str]
    eval: list[str]

    # `train, evaluate = split` unpacks the two lists, not pydantic's (field, value) pairs.
    def __iter__(self) -> Iterator[list[str]]:  # type: ignore[override]
        return iter((self.train, self.eval))


def partition_train_eval(ids: Iterable[str], train_ratio: float = 0.75, seed: int | str = 7) -> TrainEvalSplit:
    """Split ``ids`` into train and eval by a stable seeded shuffle (see the module docstring).

    Raises:
        SplitError: an id is not a non-empty string, an id repeats, or ``train_ratio`` is not
            strictly between 0 and 1.
    """
    ids = list(ids)
    if isinstance(train_ratio, bool) or not isinstance(train_ratio, (int, float)) or not 0 < train_ratio < 1:
        raise SplitError(f"train_ratio must be a number strictly between 0 and 1, not {train_ratio!r}")
    bad = [i for i in ids if not isinstance(i, str) or not i]
    if bad:
        raise SplitError(f"ids must be non-empty strings; got {bad[0]!r}")
    seen: set[str] = set()
    twice: set[str] = set()
    for i in ids:
        (twice if i in seen else seen).add(i)
    repeated = sorted(twice)
    if repeated:
        raise SplitError(f"ids must be unique; repeated: {', '.join(repeated[:10])}")
    shuffled = sorted(ids, key=lambda i: hashlib.sha256(f"{seed}:{i}".encode()).hexdigest())
    n = len(shuffled)
    n_train = math.floor(n * train_ratio + 0.5)
    if n >= 2:
        n_train = min(max(n_train, 1), n - 1)
    return TrainEvalSplit(train=shuffled[:n_train], eval=shuffled[n_train:])


def assert_no_leakage(
    train: Iterable[str],
    eval: Iterable[str],  # noqa: A002 - the public name of the split side
    fingerprints: Mapping[str, str] | None = None,
) -> None:
    """Raise LeakageError if an id is on both sides, or (with ``fingerprints``, id -> content
    hash) if one task's content is on both sides under different ids.

    Raises:
        LeakageError: naming the ids found on both sides (or the id pairs sharing content).
        SplitError: ``fingerprints`` was given but lacks some ids.
    """
    train_ids, eval_ids = list(train), list(eval)
    both = sorted(set(train_ids) & set(eval_ids))
    if both:
        shown = ", ".join(both[:20]) + (f" and {len(both) - 20} more" if len(both) > 20 else "")
        raise LeakageError(f"{len(both)} ids are in both train and eval: {shown}")
    if fingerprints is None:
        return
    missing = sorted(i for i in set(train_ids) | set(eval_ids) if i not in fingerprints)
    if missing:
        raise SplitError(f"no fingerprint for {len(missing)} ids: {', '.join(missing[:10])}")
    by_print: dict[str, str] = {fingerprints[i]: i for i in train_ids}
    pairs = [(by_print[fingerprints[i]], i) for i in eval_ids if fingerprints[i] in by_print]
    if pairs:
        shown = ", ".join(f"{t} (train) = {e} (eval)" for t, e in pairs[:20])
        raise LeakageError(f"{len(pairs)} eval tasks have the same content as a train task: {shown}")
