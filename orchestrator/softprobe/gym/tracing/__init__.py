"""OpenTelemetry traces of episodes and grading runs (optional: ``pip install 'softprobe-gym[otel]'``).

One trace per episode attempt, whose trace id is the attempt's ``source_trace_id``; a grading
run gets its own trace (its ``evaluator_trace_id``) linked ``derived_from`` the source. Without
OpenTelemetry installed, or with no provider to use, everything here does nothing. Only
:mod:`softprobe.gym.tracing.otel` and :mod:`~softprobe.gym.tracing.provider` import OpenTelemetry.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from softprobe.gym.tracing.facade import NO_TRACING, GradingRun, Scope, SpanHandle, Tracing
from softprobe.gym.tracing.ids import format_traceparent, parse_traceparent, root_span_id
from softprobe.gym.tracing.provider import current_tracing, discarding_provider, use_tracer_provider
from softprobe.gym.tracing.state import EpisodeTrace


def record_grading(runs: Iterable[GradingRun], start_ns: int, end_ns: int | None = None) -> None:
    """Record a trace per grading run: a root span ``grade`` whose trace id is the run's
    ``evaluator_trace_id``, linked (``softprobe.link.relation = derived_from``) to the root span
    of its source trace. ``start_ns``/``end_ns``: the batch's wall-clock times
    (``time.time_ns()``); ``end_ns`` defaults to now. Does nothing when tracing is off."""
    tracing = current_tracing()
    if tracing.enabled:
        tracing.grading(list(runs), start_ns, time.time_ns() if end_ns is None else end_ns)


__all__ = [
    "NO_TRACING",
    "EpisodeTrace",
    "GradingRun",
    "Scope",
    "SpanHandle",
    "Tracing",
    "current_tracing",
    "discarding_provider",
    "format_traceparent",
    "parse_traceparent",
    "record_grading",
    "root_span_id",
    "use_tracer_provider",
]
