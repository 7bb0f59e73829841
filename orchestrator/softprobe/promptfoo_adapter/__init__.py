"""Grade finished rollouts with Promptfoo assertions: the Python counterpart of
``@softprobe/promptfoo-adapter``.

Two backends, one outcome: ``native`` (promptfoo's deterministic assertion types with the same
semantics, no Node needed) and ``cli`` (the real ``promptfoo`` CLI, run offline). Each rollout's
:class:`EvalOutcome` holds promptfoo's native result bundle and the
``softprobe.framework-result/v1`` envelope (:class:`FrameworkResult`), and ends in one of the
:data:`RESULT_STATUSES`.
"""

from .errors import (
    InvalidFrameworkResultError,
    PromptfooAdapterError,
    PromptfooCliError,
    UnsupportedAssertionError,
    UnsupportedMappingError,
)
from .evaluate import choose_backend, describe_runner, execute_promptfoo_eval, grade_cases
from .framework_result import (
    MAPPINGS,
    RESULT_STATUSES,
    SCHEMA_ID,
    Finding,
    FrameworkResult,
    ResultStatus,
    TraceLink,
    framework_result_schema,
    validate_framework_result,
)
from .models import (
    Assertion,
    ComponentResult,
    EvalCase,
    EvalOutcome,
    EvalResult,
    RunnerDescription,
    SubjectFailure,
    TrajectoryStep,
)

__all__ = [
    "MAPPINGS",
    "RESULT_STATUSES",
    "SCHEMA_ID",
    "Assertion",
    "ComponentResult",
    "EvalCase",
    "EvalOutcome",
    "EvalResult",
    "Finding",
    "FrameworkResult",
    "InvalidFrameworkResultError",
    "PromptfooAdapterError",
    "PromptfooCliError",
    "ResultStatus",
    "RunnerDescription",
    "SubjectFailure",
    "TraceLink",
    "TrajectoryStep",
    "UnsupportedAssertionError",
    "UnsupportedMappingError",
    "choose_backend",
    "describe_runner",
    "execute_promptfoo_eval",
    "framework_result_schema",
    "grade_cases",
    "validate_framework_result",
]
