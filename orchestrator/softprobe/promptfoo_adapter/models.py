"""What goes into a grading and what comes out."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Backend = Literal["native", "cli", "auto"]


class Assertion(BaseModel):
    """One promptfoo assertion, as in a promptfoo config (``assert:`` entries).

    ``type`` may carry the ``not-`` prefix. ``assert`` holds the children of an ``assert-set``.
    Unknown keys are kept (and passed on to the CLI).
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    type: str = Field(min_length=1)
    value: Any = None
    threshold: float | None = None
    weight: float | None = None
    metric: str | None = None
    config: dict[str, Any] | None = None
    transform: str | None = None
    assert_: list[Assertion] | None = Field(default=None, alias="assert")

    def to_config(self) -> dict[str, Any]:
        """The assertion as a promptfoo config entry."""
        data = self.model_dump(by_alias=True, exclude_none=True, exclude={"assert_"})
        if self.assert_ is not None:
            data["assert"] = [child.to_config() for child in self.assert_]
        return data


class TrajectoryStep(BaseModel):
    """A step of the rollout for ``trajectory:*`` assertions (a dict with these keys works too)."""

    model_config = ConfigDict(extra="ignore", from_attributes=True)

    index: int | None = None
    tool: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    observation: Any = None
    error: str | None = None


class EvalCase(BaseModel):
    """One finished rollout to grade."""

    attempt_id: str
    final_output: str
    trajectory_digest: str | None = None
    source_trace_id: str | None = None
    assertions: list[Assertion]
    threshold: float | None = None
    steps: list[TrajectoryStep] | None = None
    latency_ms: float | None = None
    cost: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _steps_from_objects(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("steps") is not None:
            data = dict(data)
            data["steps"] = [
                s if isinstance(s, (dict, TrajectoryStep)) else TrajectoryStep.model_validate(s, from_attributes=True)
                for s in data["steps"]
            ]
        return data


class ComponentResult(BaseModel):
    """The outcome of one assertion."""

    passed: bool
    score: float
    reason: str
    assertion: dict[str, Any] | None = None


class EvalResult(BaseModel):
    """The outcome of grading one rollout.

    Attributes:
        passed: every assertion passed (or, with a test ``threshold``, score >= threshold).
        score: the weighted mean of the assertions' scores.
        reason: why it failed (the last failing assertion's reason), or "All assertions passed".
        named_scores: weighted mean score per ``metric`` name.
        component_results: each assertion's result (an ``assert-set``'s children follow it).
        error: ``None``, or why the test is an ERROR rather than a FAIL (a malformed assertion,
            missing data); then ``passed`` is False and ``score`` 0.
        backend: which backend graded it: ``"native"`` or ``"cli"``.
    """

    attempt_id: str
    trajectory_digest: str | None = None
    source_trace_id: str | None = None
    passed: bool
    score: float
    reason: str
    named_scores: dict[str, float] = Field(default_factory=dict)
    component_results: list[ComponentResult] = Field(default_factory=list)
    error: str | None = None
    backend: Literal["native", "cli"]
