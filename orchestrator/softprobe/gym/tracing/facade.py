"""The tracer the host uses: :class:`Tracing` does nothing (tracing off, or OpenTelemetry not
installed); :class:`~softprobe.gym.tracing.otel.OtelTracing` records spans. The host calls the
same methods either way, so nothing outside this package knows whether tracing is on.

The spans of an episode (one trace per attempt, whose trace id is its ``source_trace_id``)::

    episode                      (root: from reset, or from a fork, to finalize/destroy/next reset)
    ├── reset
    ├── step                     (one per step; TRACEPARENT of its tools names this span)
    │   └── shim.call            (the shim's own time for the call: ``tool_ms``)
    │       └── shim.command     (the process it ran: ``command_ms``)
    ├── checkpoint
    ├── fork                     (in the child's trace; links to the parent's root and branch step)
    │   ├── reset, step...       (a prefix re-execution's)
    └── finalize
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from softprobe.gym.results import StepResult
from softprobe.gym.tracing.attributes import AttributeValue
from softprobe.gym.tracing.state import EpisodeTrace


class SpanHandle:
    """A span while it is open. This one does nothing: what a span is when tracing is off.

    Attributes:
        trace_id: the trace id of a reset's new attempt (set by :meth:`Tracing.reset`), else None.
    """

    def __init__(self) -> None:
        self.trace_id: str | None = None

    def set(self, attributes: Mapping[str, AttributeValue]) -> None:
        """Add attributes to the span."""

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` naming this span (None when tracing is off)."""
        return None

    def record_step(self, result: StepResult) -> None:
        """Describe a finished step (see :func:`~softprobe.gym.tracing.attributes.step_attributes`)."""

    def shim_timings(self, diagnostics: Mapping[str, Any], received_ns: int) -> None:
        """Add the shim's own timings (``tool_ms``, ``command_ms`` in ``diagnostics``) as child
        spans ending when its answer arrived (``received_ns``, ``time.time_ns()``)."""

    def close(self, error: BaseException | None) -> None:
        """End the span, recording ``error`` if the block it was open for raised."""


class Scope:
    """A span around a block, for ``with`` and ``async with`` (so it can share a line with an
    episode's lock): opened on entry as a child of the episode's root (or of its running fork),
    ended on exit, an exception leaving the block recorded on it."""

    def __init__(
        self, tracing: Tracing, trace: EpisodeTrace, name: str, attributes: Mapping[str, AttributeValue] | None,
        *, current: bool = False, adopt: bool = False, closes: bool = False,
    ) -> None:
        self.tracing, self.trace, self.name, self.attributes = tracing, trace, name, attributes
        self.current = current  # the span is the current one inside the block
        self.adopt = adopt  # begin a new attempt first (a reset): the handle gets its trace id
        self.closes = closes  # end the episode's root after the block, unless it raised
        self.handle = SpanHandle()

    def __enter__(self) -> SpanHandle:
        trace_id = self.tracing.attempt(self.trace) if self.adopt else None
        self.handle = self.tracing.open_span(self)
        self.handle.trace_id = trace_id
        return self.handle

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.handle.close(error)
        if self.closes and error is None:
            self.tracing.end(self.trace)

    async def __aenter__(self) -> SpanHandle:
        return self.__enter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(kind, error, tb)


class ForkScope(Scope):
    """A fork's span: begins the child's trace (``trace_id``) on entry; the child's reset inside
    the block adopts that trace, and the operations inside nest under the fork's span."""

    def __init__(
        self, tracing: Tracing, child: EpisodeTrace, trace_id: str, parent: EpisodeTrace, branch_step: int,
        attributes: Mapping[str, AttributeValue],
    ) -> None:
        super().__init__(tracing, child, "fork", attributes)
        self.trace_id, self.parent, self.branch_step = trace_id, parent, branch_step

    def __enter__(self) -> SpanHandle:
        self.tracing.begin(self.trace, self.trace_id)
        self.trace.pending = True
        self.handle = self.tracing.open_span(self)
        return self.handle

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.trace.active = None
        self.trace.pending = False
        self.handle.close(error)


class Tracing:
    """Episode tracing, off: keeps the bookkeeping the host relies on (trace ids) and records
    nothing. Subclassed by the OpenTelemetry implementation, which overrides the hooks
    :meth:`begin`, :meth:`end`, :meth:`open_span` and :meth:`grading`."""

    enabled = False

    def span(
        self, trace: EpisodeTrace, name: str, attributes: Mapping[str, AttributeValue] | None = None,
        *, current: bool = False, closes: bool = False,
    ) -> Scope:
        """A span ``name`` around a block. ``current``: it is the current span inside the block,
        so spans that instrumented code (a reward function's HTTP client) starts there join it.
        ``closes``: the episode's trace is complete after the block (finalize)."""
        return Scope(self, trace, name, attributes, current=current, closes=closes)

    def reset(self, trace: EpisodeTrace) -> Scope:
        """A ``reset`` span that begins a new attempt first: its handle's ``trace_id`` is the
        attempt's (the one a fork began for its child, else a new one)."""
        return Scope(self, trace, "reset", None, adopt=True)

    def fork(
        self, child: EpisodeTrace, trace_id: str, parent: EpisodeTrace, branch_step: int,
        attributes: Mapping[str, AttributeValue],
    ) -> Scope:
        """A ``fork`` span beginning the child's trace ``trace_id``, linked to the parent's root
        and to its span of step ``branch_step`` (see :class:`ForkScope`)."""
        return ForkScope(self, child, trace_id, parent, branch_step, attributes)

    def attempt(self, trace: EpisodeTrace) -> str:
        """Begin a new attempt (a reset) and return its trace id: the one a fork began for its
        child if there is one, else a new one (a new root span then starts)."""
        if trace.pending and trace.trace_id is not None:
            trace.pending = False
            return trace.trace_id
        trace_id = secrets.token_hex(16)
        self.begin(trace, trace_id)
        return trace_id

    def begin(self, trace: EpisodeTrace, trace_id: str) -> None:
        """End the episode's open root, if any, and start a new one in trace ``trace_id``
        (attributes: ``trace.attributes``)."""
        self.end(trace)
        trace.trace_id = trace_id
        trace.step_contexts = {}

    def end(self, trace: EpisodeTrace) -> None:
        """End the episode's root span (finalize, destroy): nothing more joins its trace."""
        trace.root = None
        trace.active = None
        trace.pending = False

    def open_span(self, scope: Scope) -> SpanHandle:
        """Start the span of ``scope`` (this one starts nothing)."""
        return SpanHandle()

    def grading(self, runs: list[GradingRun], start_ns: int, end_ns: int) -> None:
        """Record one trace per grading run (see :func:`~softprobe.gym.tracing.record_grading`)."""


class GradingRun:
    """One graded rollout: its grading trace id, the source trace it is derived from, and what
    the span says about the result."""

    __slots__ = ("attributes", "evaluator_trace_id", "source_trace_id")

    def __init__(
        self, evaluator_trace_id: str, source_trace_id: str, attributes: Mapping[str, AttributeValue]
    ) -> None:
        self.evaluator_trace_id = evaluator_trace_id
        self.source_trace_id = source_trace_id
        self.attributes = dict(attributes)


NO_TRACING = Tracing()

__all__ = ["NO_TRACING", "ForkScope", "GradingRun", "Scope", "SpanHandle", "Tracing"]
