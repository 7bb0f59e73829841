"""``execute_promptfoo_eval`` and batch grading: pick a backend per rollout, grade, report."""

from __future__ import annotations

import asyncio
from typing import Any, Iterable

from .cli_backend import find_cli, run_cli
from .errors import UnsupportedAssertionError
from .models import Assertion, Backend, EvalCase, EvalResult, TrajectoryStep
from .native import MEASURED_TYPES, TRAJECTORY_TYPES, base_type, grade_native, native_problem


def _types(assertions: Iterable[Assertion]) -> set[str]:
    found: set[str] = set()
    for assertion in assertions:
        found.add(base_type(assertion.type))
        if assertion.assert_:
            found |= _types(assertion.assert_)
    return found


def _native_problem(case: EvalCase) -> str | None:
    for assertion in case.assertions:
        problem = native_problem(assertion)
        if problem:
            return problem
    return None


def _cli_problem(case: EvalCase) -> str | None:
    only_native = sorted(_types(case.assertions) & (TRAJECTORY_TYPES | MEASURED_TYPES))
    return only_native[0] if only_native else None


def choose_backend(case: EvalCase, backend: Backend) -> str:
    """Which backend grades ``case``: ``auto`` prefers native, and uses the CLI when a type
    needs it and the CLI is installed.

    Raises:
        UnsupportedAssertionError: no backend asked for (or available) can grade every type.
    """
    if backend == "native":
        return "native"  # grade_native names the unsupported type itself
    cli_problem = _cli_problem(case)
    if backend == "cli":
        if cli_problem:
            raise UnsupportedAssertionError(
                f"the CLI backend cannot grade {cli_problem!r}: promptfoo reads trajectories from "
                "trace spans and measures latency and cost itself; grade it with backend='native'",
                cli_problem,
            )
        return "cli"
    native = _native_problem(case)
    if native is None:
        return "native"
    if cli_problem is None and find_cli() is not None:
        return "cli"
    why = (
        f"it also has {cli_problem!r}, which only the native backend grades"
        if cli_problem
        else "the promptfoo CLI is not installed (npm install -g promptfoo@0.121)"
    )
    raise UnsupportedAssertionError(f"cannot grade {native!r}: the native backend lacks it and {why}", native)


async def grade_cases(cases: Iterable[EvalCase | dict[str, Any]], *, backend: Backend = "auto") -> list[EvalResult]:
    """Grade many rollouts. All that go to the CLI go through one ``promptfoo eval`` run.

    Raises:
        UnsupportedAssertionError: before anything is graded, if some case cannot be graded.
        PromptfooCliError: the CLI failed.
    """
    parsed = [c if isinstance(c, EvalCase) else EvalCase.model_validate(c) for c in cases]
    plan = [choose_backend(case, backend) for case in parsed]
    results: list[EvalResult | None] = [None] * len(parsed)
    cli_indices = [i for i, chosen in enumerate(plan) if chosen == "cli"]
    native_indices = [i for i, chosen in enumerate(plan) if chosen == "native"]

    async def native_all() -> None:
        for i in native_indices:  # off the event loop: python assertions start processes
            results[i] = await asyncio.to_thread(grade_native, parsed[i])

    async def cli_all() -> None:
        if cli_indices:
            for i, result in zip(cli_indices, await run_cli([parsed[i] for i in cli_indices])):
                results[i] = result

    await asyncio.gather(native_all(), cli_all())
    return [r for r in results if r is not None]


async def execute_promptfoo_eval(
    *,
    attempt_id: str,
    final_output: str,
    trajectory_digest: str | None = None,
    source_trace_id: str | None = None,
    assertions: list[Assertion | dict[str, Any]],
    threshold: float | None = None,
    steps: list[TrajectoryStep | dict[str, Any] | Any] | None = None,
    latency_ms: float | None = None,
    cost: float | None = None,
    backend: Backend = "auto",
) -> EvalResult:
    """Grade one finished rollout with Promptfoo assertions.

    Args:
        attempt_id / trajectory_digest / source_trace_id: carried into the result (and, with the
            CLI, into the test's metadata).
        final_output: the rollout's final answer (``rollout_to_promptfoo_input(result).final_output``).
        assertions: promptfoo assertions as dicts (``{"type": "contains", "value": "A-42"}``) or
            :class:`Assertion` models; ``not-`` prefixes, ``weight``, ``metric`` and
            ``assert-set`` work as in promptfoo.
        threshold: the test's threshold: pass when the weighted score reaches it.
        steps: the rollout's steps, for ``trajectory:*`` assertions.
        latency_ms / cost: for ``latency`` and ``cost`` assertions.
        backend: ``"native"``, ``"cli"`` or ``"auto"`` (native when it knows every type, else
            the CLI if installed).

    Returns:
        EvalResult; a malformed assertion makes the test an ERROR (``error`` set), not an
        exception, exactly as promptfoo reports it.

    Raises:
        UnsupportedAssertionError: the backend cannot grade a type (the message names it).
        PromptfooCliError: the CLI was needed and is missing, timed out or failed.
    """
    case = EvalCase(
        attempt_id=attempt_id,
        final_output=final_output,
        trajectory_digest=trajectory_digest,
        source_trace_id=source_trace_id,
        assertions=[a if isinstance(a, Assertion) else Assertion.model_validate(a) for a in assertions],
        threshold=threshold,
        steps=steps,
        latency_ms=latency_ms,
        cost=cost,
    )
    (result,) = await grade_cases([case], backend=backend)
    return result
