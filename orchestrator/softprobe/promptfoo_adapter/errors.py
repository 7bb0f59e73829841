"""Errors of the Promptfoo adapter.

A test whose assertions are malformed is not an exception: it is graded as an ERROR
(``EvalResult.error``), exactly as promptfoo reports it. Exceptions are for what stops grading
altogether.
"""

from __future__ import annotations


class PromptfooAdapterError(Exception):
    """Base class of the adapter's errors."""


class UnsupportedAssertionError(PromptfooAdapterError, ValueError):
    """The chosen backend cannot grade an assertion type (``type`` names it)."""

    def __init__(self, message: str, assertion_type: str) -> None:
        super().__init__(message)
        self.assertion_type = assertion_type


class PromptfooCliError(PromptfooAdapterError):
    """The promptfoo CLI is missing, timed out or failed; ``stderr`` holds what it said."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message + (f"\npromptfoo stderr:\n{stderr.strip()[-4000:]}" if stderr.strip() else ""))
        self.stderr = stderr
