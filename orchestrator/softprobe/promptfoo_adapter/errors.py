"""Errors of the Promptfoo adapter.

A rollout that cannot be graded is not an exception: its outcome carries a result status
(``invalid_input``, ``unsupported``, ``runner_error``...) and no score, exactly as promptfoo keeps an
ERROR apart from a FAIL. Exceptions are for what the *caller* got wrong before anything ran
(an unsupported mapping) and for the lower-level helpers (``run_cli``, ``choose_backend``).
"""

from __future__ import annotations


class PromptfooAdapterError(Exception):
    """Base class of the adapter's errors."""


class UnsupportedAssertionError(PromptfooAdapterError, ValueError):
    """The chosen backend cannot grade an assertion type (``assertion_type`` names it)."""

    def __init__(self, message: str, assertion_type: str) -> None:
        super().__init__(message)
        self.assertion_type = assertion_type


class UnsupportedMappingError(PromptfooAdapterError, ValueError):
    """A requested mapping is one the backend does not support; nothing was graded.

    Attributes:
        mapping: the mapping refused (``historic_otlp_as_eval``, ...).
        backend: the backend asked for.
    """

    def __init__(self, message: str, mapping: str, backend: str) -> None:
        super().__init__(message)
        self.mapping = mapping
        self.backend = backend


class InvalidFrameworkResultError(PromptfooAdapterError, ValueError):
    """An object is not a valid ``softprobe.framework-result/v1`` envelope (the message says where)."""


class PromptfooCliError(PromptfooAdapterError):
    """The promptfoo CLI is missing, timed out or failed; ``stderr`` holds what it said.

    ``status`` is the result status it means for the rollouts it was grading: ``runner_error``,
    ``timed_out`` or ``resource_exhausted``.
    """

    def __init__(self, message: str, stderr: str = "", *, status: str = "runner_error") -> None:
        super().__init__(message + (f"\npromptfoo stderr:\n{stderr.strip()[-4000:]}" if stderr.strip() else ""))
        self.stderr = stderr
        self.status = status


class PromptfooConfigRejectedError(PromptfooCliError):
    """promptfoo refused the whole config before grading anything (an assertion its config
    validation rejects, such as a nested ``assert-set``, or a ``$ref`` it cannot resolve):
    status ``invalid_input`` for the rollout that carries it."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message, stderr, status="invalid_input")
