"""Native bundles: promptfoo's ``EvaluateSummary`` JSON (what ``promptfoo eval -o out.json`` writes).

The CLI backend keeps what promptfoo wrote; for a batch, each rollout gets the run's output cut
down to its own test (:func:`slice_bundle`). The native backend writes the same shape itself
(:func:`native_bundle`), so code that reads one reads the other.
"""

from __future__ import annotations

import copy
import platform
import uuid
from datetime import datetime, timezone
from typing import Any

from .models import EvalCase

PROMPT = "{{ '' }}"
PROMPT_ID = "d84e1b2afc06cfc96c9864ae3b2eb22f8282f63bc6339dbaa83488a5dab13590"  # promptfoo's id of PROMPT

_ZERO_COUNTS = {"reasoning": 0, "acceptedPrediction": 0, "rejectedPrediction": 0,
                "cacheReadInputTokens": 0, "cacheCreationInputTokens": 0}


def _token_usage() -> dict[str, Any]:
    usage: dict[str, Any] = {"prompt": 0, "completion": 0, "cached": 0, "total": 0, "numRequests": 0,
                             "completionDetails": dict(_ZERO_COUNTS)}
    usage["assertions"] = {"total": 0, "prompt": 0, "completion": 0, "cached": 0, "numRequests": 0,
                           "completionDetails": dict(_ZERO_COUNTS)}
    return usage


def _tokens_used() -> dict[str, int]:
    return {"total": 0, "prompt": 0, "completion": 0, "cached": 0, "numRequests": 0}


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_metadata(case: EvalCase) -> dict[str, Any]:
    """The ids a rollout's test carries (the CLI backend puts the same in its config)."""
    return {"attemptId": case.attempt_id, "trajectoryDigest": case.trajectory_digest,
            "sourceTraceId": case.source_trace_id}


def _component(grade: dict[str, Any]) -> dict[str, Any]:
    out = {"pass": grade["pass"], "score": grade["score"], "reason": grade["reason"]}
    if "componentResults" in grade:  # an assert-set
        out["namedScores"] = grade.get("namedScores", {})
        out["tokensUsed"] = _tokens_used()
        out["componentResults"] = [_component(c) for c in grade["componentResults"]]
        out["metadata"] = {"assertionSet": {"type": "assert-set", "assertionCount": len(grade["componentResults"])}}
    elif grade.get("assertion") is not None:
        out["assertion"] = grade["assertion"]
    return out


def native_row(case: EvalCase, grade: dict[str, Any] | None, error: str | None, *, test_idx: int = 0,
               latency_ms: int = 0) -> dict[str, Any]:
    """One ``results.results[]`` row as promptfoo writes it, from the native evaluator's grade
    (``None`` with ``error`` for a test that is an ERROR)."""
    metadata = test_metadata(case)
    row: dict[str, Any] = {"cost": 0}
    if error is not None:
        row.update(error=error, gradingResult=None)
        failure_reason, success, score, named = 2, False, 0, {}
    else:
        assert grade is not None
        grading: dict[str, Any] = {"pass": grade["pass"], "score": grade["score"], "reason": grade["reason"]}
        if case.assertions:
            grading["namedScores"] = grade.get("namedScores", {})
            if grade.get("namedScoreWeights"):
                grading["namedScoreWeights"] = grade["namedScoreWeights"]
        grading["tokensUsed"] = _tokens_used()
        if case.assertions:
            grading["componentResults"] = [_component(c) for c in grade.get("componentResults", [])]
        if not grade["pass"]:
            row["error"] = grade["reason"]
        row["gradingResult"] = grading
        failure_reason, success = (0 if grade["pass"] else 1), grade["pass"]
        score, named = grade["score"], grading.get("namedScores", {})
    row.update(
        id=str(uuid.uuid4()),
        latencyMs=latency_ms,
        namedScores=named,
        prompt={"raw": "", "label": PROMPT, "config": {}},
        promptId=PROMPT_ID,
        promptIdx=0,
        provider={"id": "echo", "label": ""},
        score=score,
        success=success,
        testCase={"description": case.attempt_id, "providerOutput": case.final_output, "metadata": metadata,
                  "assert": [a.to_config() for a in case.assertions], "vars": {}, "options": {},
                  **({"threshold": case.threshold} if case.threshold is not None else {})},
        testIdx=test_idx,
        tokenUsage=_token_usage(),
        vars={},
        metadata=dict(metadata),
        failureReason=failure_reason,
    )
    if error is None:  # promptfoo keeps no response on an ERROR row
        row["response"] = {"output": case.final_output, "tokenUsage": _token_usage(), "cost": 0, "cached": False}
    return row


def _prompt_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    asserts = [c for row in rows for c in ((row.get("gradingResult") or {}).get("componentResults") or [])]
    named: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in rows:
        for name, value in (row.get("namedScores") or {}).items():
            named[name] = named.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
    return {
        "score": sum(row.get("score") or 0 for row in rows),
        "testPassCount": sum(row.get("failureReason") == 0 for row in rows),
        "testFailCount": sum(row.get("failureReason") == 1 for row in rows),
        "testErrorCount": sum(row.get("failureReason") == 2 for row in rows),
        "assertPassCount": sum(bool(c.get("pass")) for c in asserts),
        "assertFailCount": sum(not c.get("pass") for c in asserts),
        "totalLatencyMs": sum(row.get("latencyMs") or 0 for row in rows),
        "tokenUsage": _token_usage(),
        "namedScores": named,
        "namedScoresCount": counts,
        "namedScoreWeights": dict(counts),
        "cost": 0,
    }


def _stats(rows: list[dict[str, Any]], duration_ms: int) -> dict[str, Any]:
    return {
        "successes": sum(row.get("failureReason") == 0 for row in rows),
        "failures": sum(row.get("failureReason") == 1 for row in rows),
        "errors": sum(row.get("failureReason") == 2 for row in rows),
        "tokenUsage": _token_usage(),
        "durationMs": duration_ms,
        "evaluationDurationMs": duration_ms,
    }


def native_bundle(case: EvalCase, row: dict[str, Any], *, started: datetime, duration_ms: int,
                  evaluator_version: str) -> dict[str, Any]:
    """The ``EvaluateSummary`` the native backend writes for one rollout: promptfoo's shape.

    ``metadata.promptfooVersion`` is null (promptfoo did not run) and ``metadata.evaluator`` names
    the native evaluator instead.
    """
    created = _iso(started)
    tests = [row["testCase"]]
    return {
        "evalId": f"eval-native-{started.astimezone(timezone.utc).strftime('%Y-%m-%dT%H:%M:%S')}",
        "results": {
            "version": 3,
            "timestamp": created,
            "prompts": [{"id": PROMPT_ID, "raw": PROMPT, "label": PROMPT, "provider": "echo",
                         "metrics": _prompt_metrics([row])}],
            "results": [row],
            "stats": _stats([row], duration_ms),
        },
        "config": {"tags": {}, "description": "softprobe-gym grading", "prompts": [PROMPT], "providers": ["echo"],
                   "tests": [{k: v for k, v in t.items() if k not in ("vars", "options")} for t in tests],
                   "env": {}, "sharing": False, "outputPath": [], "extensions": [], "metadata": {},
                   "evaluateOptions": {}},
        "shareableUrl": None,
        "metadata": {"promptfooVersion": None, "nodeVersion": None, "platform": platform.system().lower(),
                     "arch": platform.machine(), "exportedAt": _iso(datetime.now(timezone.utc)),
                     "evaluationCreatedAt": created, "evaluator": evaluator_version},
        "runtimeOptions": {"eventSource": "softprobe-native", "showProgressBar": False, "repeat": 1,
                           "maxConcurrency": 1, "cache": False},
    }


def slice_bundle(report: dict[str, Any], test_idx: int, row: dict[str, Any]) -> dict[str, Any]:
    """promptfoo's output of a batch cut down to one test: its row and its config test as written,
    ``stats`` and the prompt metrics' counts recounted over that row; everything else as written.
    """
    out = dict(report)
    results = dict(report.get("results") or {})
    results["results"] = [row]
    stats = dict(results.get("stats") or {})
    stats.update({k: v for k, v in _stats([row], 0).items() if k in ("successes", "failures", "errors")})
    results["stats"] = stats
    prompts = []
    for prompt in results.get("prompts") or []:
        prompt = dict(prompt)
        metrics = dict(prompt.get("metrics") or {})
        recount = _prompt_metrics([row])
        metrics.update({k: recount[k] for k in ("score", "testPassCount", "testFailCount", "testErrorCount",
                                                "assertPassCount", "assertFailCount", "totalLatencyMs",
                                                "namedScores", "namedScoresCount") if k in metrics})
        prompt["metrics"] = metrics
        prompts.append(prompt)
    results["prompts"] = prompts
    out["results"] = results
    config = report.get("config")
    if isinstance(config, dict) and isinstance(config.get("tests"), list) and test_idx < len(config["tests"]):
        out["config"] = {**config, "tests": [config["tests"][test_idx]]}
    return copy.deepcopy(out)
