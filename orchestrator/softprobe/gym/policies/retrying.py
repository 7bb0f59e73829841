"""Which model-endpoint failures are retried, and how long to wait before the next attempt.

Transient: no connection (or a timeout), and the statuses 408, 409, 429 and 5xx. Every other 4xx
is the request's own fault: retrying would only repeat it.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Callable
from typing import Any

from tenacity import RetryCallState

#: HTTP statuses below 500 that are worth another attempt.
TRANSIENT_STATUSES = frozenset({408, 409, 429})
#: Characters of an error response's body kept in :class:`ModelRequestError`.
BODY_HEAD_CHARS = 500


def status_of(error: BaseException) -> int | None:
    """The HTTP status of an ``openai`` error, or None (no response: a connection error)."""
    status = getattr(error, "status_code", None)
    return status if isinstance(status, int) else None


def is_transient(error: BaseException) -> bool:
    """Whether a failed request is worth another attempt (see the module docstring)."""
    import openai

    if isinstance(error, openai.APIConnectionError):  # timeouts are connection errors too
        return True
    status = status_of(error)
    return status is not None and (status in TRANSIENT_STATUSES or status >= 500)


def retry_after_s(error: BaseException, *, now: float | None = None) -> float | None:
    """The wait a response asked for: ``retry-after-ms``, else ``Retry-After`` (seconds or an
    HTTP date); None when it asked for none (or said something unreadable)."""
    response = getattr(error, "response", None)
    headers: Any = getattr(response, "headers", None)
    if headers is None:
        return None
    millis = _finite(headers.get("retry-after-ms"))
    if millis is not None:
        return max(millis / 1000, 0.0)
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _finite(value)
    if seconds is not None:
        return max(seconds, 0.0)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


def _finite(value: object) -> float | None:
    """``value`` as a finite number, or None: "nan" and "inf" parse as floats but are no wait
    (a NaN passes both ``max`` and ``min`` unchanged and would reach the sleep)."""
    if value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def wait_for(backoff_s: float, cap_s: float) -> Callable[[RetryCallState], float]:
    """tenacity's ``wait``: the response's Retry-After if it gave one, else ``backoff_s``
    doubled per attempt; never more than ``cap_s``."""

    def wait(state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        asked = retry_after_s(error) if error is not None else None
        if asked is not None:
            return min(asked, cap_s)
        return float(min(backoff_s * 2 ** (state.attempt_number - 1), cap_s))

    return wait


def body_head(error: BaseException) -> str:
    """The start of an error response's body (or the error's text when there was none)."""
    response = getattr(error, "response", None)
    text = getattr(response, "text", None) if response is not None else None
    if not isinstance(text, str):
        text = str(error)
    return text[:BODY_HEAD_CHARS]


__all__ = ["TRANSIENT_STATUSES", "body_head", "is_transient", "retry_after_s", "status_of", "wait_for"]
