"""The Promptfoo adapter beyond parity: trajectories, measured values, backends, CLI failures."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from softprobe.promptfoo_adapter import (
    PromptfooCliError,
    UnsupportedAssertionError,
    choose_backend,
    execute_promptfoo_eval,
)
from softprobe.promptfoo_adapter.cli_backend import find_cli, literal, run_cli
from softprobe.promptfoo_adapter.models import EvalCase

STEPS = [
    {"index": 1, "tool": "crm.get_account", "args": {"id": "A-42", "verbose": False}, "observation": {}},
    {"index": 2, "tool": "fs.write", "args": {"path": "refund-note.md", "content": "x"}, "observation": "ok"},
    {"index": 3, "tool": None, "args": {}, "observation": "done"},
]


async def grade(*assertions, steps=STEPS, **extra):
    return await execute_promptfoo_eval(
        attempt_id="t", final_output="done", assertions=list(assertions), steps=steps, backend="native", **extra
    )


@pytest.mark.parametrize(
    "assertion, passed",
    [
        ({"type": "trajectory:tool-used", "value": "crm.get_account"}, True),
        ({"type": "trajectory:tool-used", "value": ["crm.*", "fs.write"]}, True),
        ({"type": "trajectory:tool-used", "value": "shell.exec"}, False),
        ({"type": "not-trajectory:tool-used", "value": "shell.exec"}, True),
        ({"type": "trajectory:tool-used", "value": {"name": "fs.*", "min": 1, "max": 1}}, True),
        ({"type": "trajectory:tool-used", "value": {"name": "fs.write", "min": 2}}, False),
        ({"type": "trajectory:tool-sequence", "value": ["crm.get_account", "fs.write"]}, True),
        ({"type": "trajectory:tool-sequence", "value": ["fs.write", "crm.get_account"]}, False),
        ({"type": "trajectory:tool-sequence", "value": {"mode": "exact", "steps": ["crm.get_account"]}}, False),
        ({"type": "trajectory:tool-args-match", "value": {"name": "crm.get_account", "args": {"id": "A-42"}}}, True),
        ({"type": "trajectory:tool-args-match", "value": {"name": "crm.get_account", "args": {"id": "A-7"}}}, False),
        ({"type": "trajectory:tool-args-match", "value": {"name": "crm.get_account", "args": {"id": "A-42"},
                                                           "mode": "exact", "defaults": {"verbose": False}}}, True),
        ({"type": "trajectory:tool-args-match", "value": {"name": "fs.write", "args": {"path": "refund-note.md"},
                                                           "mode": "exact", "ignore": "content"}}, True),
        ({"type": "trajectory:step-count", "value": {"min": 3, "max": 3}}, True),
        ({"type": "trajectory:step-count", "value": {"type": "tool", "max": 1}}, False),
    ],
)
async def test_trajectory_assertions_read_the_rollout_steps(assertion, passed):
    result = await grade(assertion)
    assert result.passed is passed and result.error is None, result


async def test_trajectory_assertions_without_steps_are_an_error():
    result = await grade({"type": "trajectory:tool-used", "value": "x"}, steps=None)
    assert result.error and "No trace data" in result.error and not result.passed


async def test_latency_and_cost_use_the_values_the_caller_supplies():
    ok = await grade({"type": "latency", "threshold": 100}, {"type": "cost", "threshold": 0.5}, latency_ms=80, cost=0.2)
    assert ok.passed
    slow = await grade({"type": "latency", "threshold": 100}, latency_ms=120)
    assert not slow.passed and slow.error is None and "Latency 120ms" in slow.reason
    missing = await grade({"type": "latency", "threshold": 100})
    assert missing.error and "latency_ms" in missing.error
    no_threshold = await grade({"type": "cost"}, cost=1.0)
    assert no_threshold.error and "threshold" in no_threshold.error


async def test_results_carry_the_ids_and_named_scores():
    result = await execute_promptfoo_eval(
        attempt_id="fatt_1", final_output="A-42", trajectory_digest="sha256:abc", source_trace_id="0" * 31 + "1",
        assertions=[{"type": "contains", "value": "A-42", "metric": "lookup"}, {"type": "contains", "value": "B", "metric": "lookup"}],
        backend="native",
    )
    assert (result.attempt_id, result.trajectory_digest, result.source_trace_id) == ("fatt_1", "sha256:abc", "0" * 31 + "1")
    assert result.named_scores == {"lookup": 0.5} and result.score == 0.5
    assert [c.passed for c in result.component_results] == [True, False]
    assert result.reason == 'Expected output to contain "B"'


async def test_the_native_backend_names_a_type_it_lacks_in_an_unsupported_outcome():
    outcome = await execute_promptfoo_eval(attempt_id="t", final_output="x", assertions=[{"type": "javascript", "value": "true"}], backend="native")
    assert outcome.status == "unsupported" and "'javascript'" in outcome.error
    assert outcome.score is None and not outcome.passed and outcome.native_bundle is None
    with pytest.raises(UnsupportedAssertionError, match="'javascript'") as caught:
        choose_backend(EvalCase(attempt_id="t", final_output="x", assertions=[{"type": "javascript", "value": "true"}]), "native")
    assert caught.value.assertion_type == "javascript"


async def test_the_cli_backend_refuses_what_only_the_native_backend_grades():
    outcome = await execute_promptfoo_eval(attempt_id="t", final_output="x", steps=STEPS,
                                           assertions=[{"type": "trajectory:tool-used", "value": "x"}], backend="cli")
    assert outcome.status == "unsupported" and "trajectory:tool-used" in outcome.error and outcome.backend == "cli"


async def test_auto_without_the_cli_says_how_to_install_it(monkeypatch):
    monkeypatch.setenv("SOFTPROBE_PROMPTFOO", "/nonexistent/promptfoo")
    assert find_cli() is None
    native = await execute_promptfoo_eval(attempt_id="t", final_output="x", assertions=[{"type": "contains", "value": "x"}])
    assert native.backend == "native" and native.status == "succeeded"
    lacking = await execute_promptfoo_eval(attempt_id="t", final_output="x", assertions=[{"type": "javascript", "value": "true"}])
    assert lacking.status == "unsupported" and "npm install -g promptfoo@0.121" in lacking.error
    missing = await execute_promptfoo_eval(attempt_id="t", final_output="x", assertions=[{"type": "contains", "value": "x"}], backend="cli")
    assert missing.status == "runner_error" and "not installed" in missing.error and missing.score is None
    with pytest.raises(PromptfooCliError, match="not installed"):
        await run_cli([EvalCase(attempt_id="t", final_output="x", assertions=[])])


def fake_cli(tmp_path: Path, script: str) -> str:
    path = tmp_path / "promptfoo"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


async def test_an_operational_failure_carries_promptfoos_stderr(tmp_path, monkeypatch):
    monkeypatch.setenv("SOFTPROBE_PROMPTFOO", fake_cli(tmp_path, "echo 'config is broken: line 3' >&2; exit 1\n"))
    with pytest.raises(PromptfooCliError, match="exit code 1") as caught:
        await run_cli([EvalCase(attempt_id="t", final_output="x", assertions=[{"type": "contains", "value": "x"}])])
    assert "config is broken: line 3" in str(caught.value) and "config is broken" in caught.value.stderr
    assert caught.value.status == "runner_error"


async def test_a_hanging_cli_times_out_with_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SOFTPROBE_PROMPTFOO", fake_cli(tmp_path, "echo starting >&2; exec sleep 30\n"))
    with pytest.raises(PromptfooCliError, match="did not finish within 0.5s") as caught:
        await run_cli([EvalCase(attempt_id="t", final_output="x", assertions=[])], timeout_s=0.5)
    assert "starting" in caught.value.stderr and caught.value.status == "timed_out"


def test_template_syntax_is_escaped_to_render_literally():
    assert literal("plain") == "plain"
    assert literal("{{ x }}") == "{% raw %}{{ x }}{% endraw %}"
    assert literal("a {% endraw %} b") == "{% raw %}a {% endraw %}{{ '{% endraw %}' }}{% raw %} b{% endraw %}"


@pytest.mark.parametrize("value", ["10**400", "'Infinity'"])
async def test_a_python_score_past_the_float_range_is_written_as_promptfoo_writes_it(value):
    """JSON.stringify writes Infinity as null: the native bundle holds null, the score reads 0."""
    import json

    outcome = await execute_promptfoo_eval(
        attempt_id="t", final_output="x", assertions=[{"type": "python", "value": value}], backend="native"
    )
    assert outcome.error is None and outcome.passed is True and outcome.score == 0.0
    json.dumps(outcome.native_bundle, allow_nan=False)  # JSON, as promptfoo's own file would be
    assert outcome.framework_result.findings[0].score == 0.0
