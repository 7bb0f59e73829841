"""Retry policy for Docker control-plane calls (never for actions)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import docker.errors
import requests.exceptions
from tenacity import (
    before_sleep_log,
    retry,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

log = logging.getLogger("softprobe.gym.docker")

T = TypeVar("T")

# Conflicts Docker reports while another operation on the same object is still under way.
_TRANSIENT_CONFLICTS = ("already in progress", "is restarting", "is paused", "cannot remove a running")


def is_transient(err: BaseException) -> bool:
    """Whether a Docker control-plane error is worth retrying."""
    if isinstance(err, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return True
    if isinstance(err, docker.errors.APIError) and not isinstance(err, docker.errors.NotFound):
        status = err.status_code or 0
        if status >= 500 and "No such image" not in str(err.explanation or ""):
            return True
        if status == 409 and any(s in str(err.explanation or "") for s in _TRANSIENT_CONFLICTS):
            return True
    return False


def control_plane(func: Callable[..., T]) -> Callable[..., T]:
    """Retry ``func`` on transient errors: exponential backoff (full jitter), at most 6 tries or 30 s."""
    return retry(
        retry=retry_if_exception(is_transient),
        wait=wait_random_exponential(multiplier=0.1, max=3.0),
        stop=stop_after_attempt(6) | stop_after_delay(30),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )(func)
