"""What the tracer remembers of one episode between the host's calls (no OpenTelemetry here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EpisodeTrace:
    """One episode's tracing state; the host keeps one per episode and never looks inside.

    Attributes:
        trace_id: the trace of the episode's current attempt (its ``source_trace_id``), once begun.
        root: the open root span (``episode``), or None when tracing is off or it has ended.
        root_context: the root's span context, kept after it ends (a fork links to it).
        step_contexts: span contexts of this attempt's steps by index (a fork links to its branch
            step).
        active: the span that operations nest under instead of the root (a fork's, while it runs).
        pending: a fork began this trace for its child; the child's reset adopts it.
        attributes: what every root span of the episode says (its id, its host's id).
    """

    trace_id: str | None = None
    root: Any = None
    root_context: Any = None
    step_contexts: dict[int, Any] = field(default_factory=dict)
    active: Any = None
    pending: bool = False
    attributes: dict[str, str] = field(default_factory=dict)


__all__ = ["EpisodeTrace"]
