"""Trace and span ids as the W3C Trace Context spells them (no OpenTelemetry needed here).

A root span's id is derived from its trace id (:func:`root_span_id`), so a run that only knows an
episode's ``source_trace_id`` (grading, from ``result.json``) can still link to that episode's root
span, in another process and later.
"""

from __future__ import annotations

import hashlib
import re

#: ``00-<trace id>-<span id>-<flags>``, lowercase hex, version 00 only.
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
TRACE_ID = re.compile(r"[0-9a-f]{32}")


def is_trace_id(value: object) -> bool:
    """Whether ``value`` is a valid trace id: 32 lowercase hex digits, not all zero."""
    return isinstance(value, str) and TRACE_ID.fullmatch(value) is not None and int(value, 16) != 0


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """The W3C ``traceparent`` value for a span: ``00-<32 hex>-<16 hex>-<2 hex>``."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags & 0xFF:02x}"


def parse_traceparent(value: object) -> tuple[str, str, str] | None:
    """``(trace_id, span_id, flags)`` of a valid version-00 ``traceparent``, else None (all-zero
    ids are invalid, as the W3C says)."""
    if not isinstance(value, str):
        return None
    match = TRACEPARENT.fullmatch(value)
    if match is None or int(match[1], 16) == 0 or int(match[2], 16) == 0:
        return None
    return match[1], match[2], match[3]


def root_span_id(trace_id: str) -> int:
    """The span id of the root span of trace ``trace_id`` (64 bits, never 0): a digest of the
    trace id, so it can be recomputed wherever the trace id is known."""
    digest = hashlib.sha256(b"softprobe-gym root span " + trace_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


__all__ = ["TRACEPARENT", "format_traceparent", "is_trace_id", "parse_traceparent", "root_span_id"]
