"""Grade finished rollouts with Promptfoo assertions: the Python counterpart of
``@softprobe/promptfoo-adapter``.

Two backends, one result model: ``native`` (promptfoo's deterministic assertion types with the
same semantics, no Node needed) and ``cli`` (the real ``promptfoo`` CLI, run offline).
"""

from .errors import PromptfooAdapterError, PromptfooCliError, UnsupportedAssertionError
from .evaluate import choose_backend, execute_promptfoo_eval, grade_cases
from .models import Assertion, ComponentResult, EvalCase, EvalResult, TrajectoryStep

__all__ = [
    "Assertion",
    "ComponentResult",
    "EvalCase",
    "EvalResult",
    "PromptfooAdapterError",
    "PromptfooCliError",
    "TrajectoryStep",
    "UnsupportedAssertionError",
    "choose_backend",
    "execute_promptfoo_eval",
    "grade_cases",
]
