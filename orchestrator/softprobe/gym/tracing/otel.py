"""Episode tracing with OpenTelemetry: the only module of the library that imports it.

Imported only when ``opentelemetry-api`` is installed (:mod:`softprobe.gym.tracing.provider`
decides). Root spans get their trace id from the episode (its ``source_trace_id``) and their span
id from :func:`~softprobe.gym.tracing.ids.root_span_id`: for an SDK tracer, through an id
generator pinned for the duration of the ``start_span`` call (a true root: no parent span id);
for any other tracer, under a non-recording remote parent carrying that trace id (the root then
names a parent that is never exported, the price of a tracer we cannot configure).
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from softprobe.gym.results import StepResult
from softprobe.gym.tracing.attributes import AttributeValue, step_attributes
from softprobe.gym.tracing.facade import ForkScope, GradingRun, Scope, SpanHandle, Tracing
from softprobe.gym.tracing.ids import format_traceparent, is_trace_id, root_span_id
from softprobe.gym.tracing.state import EpisodeTrace

# (trace id, span id) the next span started in this context gets, while a root is being started.
_PINNED: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("softprobe_pinned_ids", default=None)


class PinnedIds:
    """An SDK id generator that hands out the pinned ids while a root starts, else asks ``inner``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def generate_trace_id(self) -> int:
        pinned = _PINNED.get()
        return pinned[0] if pinned is not None else int(self.inner.generate_trace_id())

    def generate_span_id(self) -> int:
        pinned = _PINNED.get()
        return pinned[1] if pinned is not None else int(self.inner.generate_span_id())

    def is_trace_id_random(self) -> bool:
        # Pinned trace ids come from secrets.token_hex: random too.
        return bool(self.inner.is_trace_id_random())


def pin_ids(tracer: trace.Tracer) -> bool:
    """Give an SDK tracer the pinnable id generator (once); False if it has no id generator."""
    inner = getattr(tracer, "id_generator", None)
    if inner is None:
        return False
    if not isinstance(inner, PinnedIds):
        tracer.id_generator = PinnedIds(inner)  # type: ignore[attr-defined]
    return True


class _Span(SpanHandle):
    """An open OpenTelemetry span; ``token``: its context, attached while it is current."""

    def __init__(self, tracer: trace.Tracer, span: trace.Span, trace_state: EpisodeTrace, current: bool) -> None:
        super().__init__()
        self._tracer = tracer
        self.span = span
        self._trace = trace_state
        self._token = otel_context.attach(trace.set_span_in_context(span)) if current else None

    def set(self, attributes: Mapping[str, AttributeValue]) -> None:
        self.span.set_attributes(attributes)

    def traceparent(self) -> str | None:
        ctx = self.span.get_span_context()
        return format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags)) if ctx.is_valid else None

    def record_step(self, result: StepResult) -> None:
        self.span.set_attributes(step_attributes(result))
        if result.error is not None:
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, result.error.type))
        self._trace.step_contexts[result.index] = self.span.get_span_context()

    def shim_timings(self, diagnostics: Mapping[str, Any], received_ns: int) -> None:
        tool_ms = _number(diagnostics.get("tool_ms"))
        if tool_ms is None:
            return
        # The shim measures with its own clock; placed to end when its answer arrived (the
        # transit back is not counted), the command starting with the call (what comes first
        # is a quota check).
        start = received_ns - int(tool_ms * 1e6)
        call = self._tracer.start_span("shim.call", context=trace.set_span_in_context(self.span), start_time=start,
                                       attributes={"softprobe.shim.tool_ms": tool_ms})
        command_ms = _number(diagnostics.get("command_ms"))
        if command_ms is not None:
            command = self._tracer.start_span("shim.command", context=trace.set_span_in_context(call),
                                              start_time=start, attributes={"softprobe.shim.command_ms": command_ms})
            command.end(end_time=start + int(command_ms * 1e6))
        call.end(end_time=received_ns)

    def close(self, error: BaseException | None) -> None:
        if self._token is not None:
            otel_context.detach(self._token)
        if error is not None:
            # The type only: a message may carry paths or tool output, and spans never hold
            # contents.
            self.span.set_attribute("error.type", type(error).__name__)
            self.span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
        self.span.end()


class OtelTracing(Tracing):
    """Episode tracing into an OpenTelemetry tracer (see :mod:`~softprobe.gym.tracing.facade`
    for the tree of spans)."""

    enabled = True

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer
        self._pinned = pin_ids(tracer)

    def start_root(
        self, name: str, trace_id: str, attributes: Mapping[str, AttributeValue],
        links: Sequence[trace.Link] = (), start_time: int | None = None,
    ) -> trace.Span:
        """A root span of trace ``trace_id`` (32 hex) whose span id is ``root_span_id(trace_id)``."""
        ids = (int(trace_id, 16), root_span_id(trace_id))
        if not self._pinned:
            remote = trace.SpanContext(ids[0], ids[1], is_remote=True,
                                       trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
            ctx = trace.set_span_in_context(trace.NonRecordingSpan(remote))
            return self.tracer.start_span(name, context=ctx, attributes=attributes, links=links,
                                          start_time=start_time)
        token = _PINNED.set(ids)
        try:
            # An empty context: a root even if the caller has a span current.
            return self.tracer.start_span(name, context=otel_context.Context(), attributes=attributes,
                                          links=links, start_time=start_time)
        finally:
            _PINNED.reset(token)

    def begin(self, trace_state: EpisodeTrace, trace_id: str) -> None:
        super().begin(trace_state, trace_id)
        trace_state.root = self.start_root("episode", trace_id, trace_state.attributes)
        trace_state.root_context = trace_state.root.get_span_context()

    def end(self, trace_state: EpisodeTrace) -> None:
        root = trace_state.root
        super().end(trace_state)
        if root is not None:
            root.end()

    def open_span(self, scope: Scope) -> SpanHandle:
        state = scope.trace
        links: list[trace.Link] = []
        if isinstance(scope, ForkScope):
            if scope.parent.root_context is not None:
                links.append(trace.Link(scope.parent.root_context, {"softprobe.link.relation": "forked_from"}))
            branch = scope.parent.step_contexts.get(scope.branch_step)
            if branch is not None:
                links.append(trace.Link(branch, {"softprobe.link.relation": "branch_step"}))
        parent = state.active or state.root
        if parent is None and state.root_context is not None:  # after finalize: still in its trace
            parent = trace.NonRecordingSpan(state.root_context)
        ctx = trace.set_span_in_context(parent) if parent is not None else otel_context.Context()
        span = self.tracer.start_span(scope.name, context=ctx, attributes=scope.attributes, links=links)
        if isinstance(scope, ForkScope):
            state.active = span
        return _Span(self.tracer, span, state, scope.current)

    def grading(self, runs: list[GradingRun], start_ns: int, end_ns: int) -> None:
        for run in runs:
            if not is_trace_id(run.evaluator_trace_id):
                continue
            links = []
            if is_trace_id(run.source_trace_id):  # else a recorded id that is no trace id: no link
                source = trace.SpanContext(int(run.source_trace_id, 16), root_span_id(run.source_trace_id),
                                           is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
                links.append(trace.Link(source, {"softprobe.link.relation": "derived_from"}))
            span = self.start_root("grade", run.evaluator_trace_id, run.attributes, links=links, start_time=start_ns)
            span.end(end_time=end_ns)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


__all__ = ["OtelTracing", "PinnedIds", "pin_ids"]
