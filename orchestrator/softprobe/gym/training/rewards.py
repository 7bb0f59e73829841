"""From environment facts to numeric rewards.

``reward_from(ctx)`` returns *facts* about the world after a step, not scores::

    {"checks": [{"name": "note_written", "passed": True}],   # named pass/fail signals
     "workspace_digest": "sha256:...",                        # optional fingerprint
     "metrics": {"tests_passing": 7}}                         # optional numbers

:func:`map_reward_components` turns them into ``RewardComponent``s: each check becomes
``kind="check"`` with value 1.0 (passed) or 0.0; each metric becomes ``kind="metric"`` with its
value. A step's ``reward`` is the aggregate of its components: their sum by default.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from softprobe.gym.errors import RewardError
from softprobe.gym.results import RewardComponent, StepResult


class Check(BaseModel):
    """A named pass/fail signal about the world."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    passed: StrictBool


class Facts(BaseModel):
    """What ``reward_from`` returns."""

    model_config = ConfigDict(extra="forbid")

    checks: list[Check] = Field(default_factory=list)
    workspace_digest: str | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


Aggregate = Literal["sum", "mean"] | Callable[[list[RewardComponent]], float]


def parse_facts(facts: object) -> Facts:
    """Validate what ``reward_from`` returned; RewardError names the check that is wrong."""
    if isinstance(facts, Facts):
        return facts
    if not isinstance(facts, dict):
        raise RewardError(f"reward_from must return a dict of facts, not {type(facts).__name__}")
    try:
        parsed = Facts.model_validate(facts)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = e["loc"]
            where = ".".join(str(p) for p in loc)
            if loc[:1] == ("checks",) and len(loc) > 1 and isinstance(loc[1], int):
                checks = facts.get("checks") or []
                item = checks[loc[1]] if loc[1] < len(checks) else None
                name = item.get("name") if isinstance(item, dict) else None
                where = f"check {name!r}" if name else f"check #{loc[1] + 1}"
                if len(loc) > 2:
                    where += f" field {loc[2]!r}"
            problems.append(f"{where}: {e['msg']}")
        raise RewardError("reward_from returned malformed facts: " + "; ".join(problems)) from None
    names = [check.name for check in parsed.checks]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise RewardError(f"reward_from returned the check {duplicates[0]!r} more than once")
    bad = [name for name, value in parsed.metrics.items() if not math.isfinite(value)]
    if bad:
        raise RewardError(f"reward_from returned a metric that is not a finite number: {bad[0]!r}")
    return parsed


def map_reward_components(facts: Facts | dict[str, Any]) -> list[RewardComponent]:
    """Turn facts into reward components: checks first (1.0 / 0.0), then metrics, in order.

    Raises:
        RewardError: the facts are malformed (the message names the check).
    """
    parsed = parse_facts(facts)
    components = [
        RewardComponent(kind="check", name=check.name, value=1.0 if check.passed else 0.0)
        for check in parsed.checks
    ]
    components += [
        RewardComponent(kind="metric", name=name, value=float(value))
        for name, value in parsed.metrics.items()
    ]
    return components


def aggregate_reward(components: list[RewardComponent], how: Aggregate = "sum") -> float:
    """A step's reward from its components: ``"sum"`` (default), ``"mean"`` or your function."""
    if callable(how):
        return float(how(components))
    values = [component.value for component in components]
    if how == "sum":
        return float(sum(values))
    if how == "mean":
        return float(sum(values) / len(values)) if values else 0.0
    raise ValueError(f"unknown reward aggregate {how!r}: use 'sum', 'mean' or a function")


@dataclass(frozen=True)
class RewardContext:
    """What ``reward_from(ctx)`` receives after each step."""

    step_result: StepResult
    episode_id: str
    step_index: int


RewardFrom = Callable[[RewardContext], dict[str, Any] | Facts | Awaitable[dict[str, Any] | Facts]]


class RewardTracker:
    """Scores the steps of one rollout with ``reward_from``.

    Keeps the component names stable across the rollout: a check that disappears (or appears)
    is an error, never a silent 0.
    """

    def __init__(self, reward_from: RewardFrom, aggregate: Aggregate = "sum") -> None:
        if not callable(reward_from):
            raise TypeError("reward_from must be callable")
        if aggregate not in ("sum", "mean") and not callable(aggregate):
            raise ValueError("reward_aggregate must be 'sum', 'mean' or a function")
        self.reward_from = reward_from
        self.aggregate = aggregate
        self.facts: list[Facts] = []
        self._names: list[tuple[str, str]] | None = None

    def restart(self) -> None:
        """A new rollout: forget the previous one's facts and names."""
        self.facts, self._names = [], None

    async def score(self, result: StepResult) -> None:
        """Set ``result.reward_components`` and ``result.reward`` from ``reward_from``'s facts.

        Raises:
            RewardError: ``reward_from`` raised, returned malformed facts, or changed its checks;
                the error carries ``step_result``.
        """
        ctx = RewardContext(step_result=result, episode_id=result.episode_id, step_index=result.index)
        try:
            raw = self.reward_from(ctx)
            if inspect.isawaitable(raw):
                raw = await raw
        except Exception as err:
            raise RewardError(
                f"reward_from raised {type(err).__name__} at step {result.index}: {err}", result
            ) from err
        try:
            facts = parse_facts(raw)
            components = map_reward_components(facts)
        except RewardError as err:
            raise RewardError(f"step {result.index}: {err}", result) from None
        names = [(c.kind, c.name) for c in components]
        if self._names is None:
            self._names = names
        elif sorted(names) != sorted(self._names):
            gone = [n for k, n in self._names if (k, n) not in names]
            new = [n for k, n in names if (k, n) not in self._names]
            what = f"check {gone[0]!r} disappeared" if gone else f"check {new[0]!r} appeared"
            raise RewardError(
                f"{what} at step {result.index}: reward_from must return the same checks and "
                f"metrics at every step of a rollout (the first step had "
                f"{', '.join(n for _, n in self._names) or 'none'})",
                result,
            )
        self.facts.append(facts)
        result.reward_components = components
        result.reward = aggregate_reward(components, self.aggregate)
