"""The adapter's outcome: promptfoo's native bundle, the framework-result/v1 envelope, result
statuses, describe_runner and requested mappings, trace links."""

from __future__ import annotations

import asyncio
import errno
import json
import stat
from pathlib import Path

import pytest

from softprobe.promptfoo_adapter import (
    RESULT_STATUSES,
    SCHEMA_ID,
    EvalCase,
    InvalidFrameworkResultError,
    SubjectFailure,
    TraceLink,
    UnsupportedMappingError,
    describe_runner,
    execute_promptfoo_eval,
    framework_result_schema,
    grade_cases,
    validate_framework_result,
)
from softprobe.promptfoo_adapter import evaluate as evaluate_module
from softprobe.promptfoo_adapter import outcome as outcome_module
from softprobe.promptfoo_adapter.framework_result import generated_schema

SOURCE = "4bf92f3577b34da6a3ce929d0e0e4736"
STEPS = [{"index": 1, "tool": "crm.get_account", "args": {"id": "A-42"}, "observation": {}}]


def fake_cli(tmp_path: Path, script: str) -> str:
    path = tmp_path / "promptfoo"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


# -- the envelope ---------------------------------------------------------------------------------


def test_the_shipped_schema_is_the_models_schema():
    assert framework_result_schema() == generated_schema()
    assert framework_result_schema()["properties"]["schema"]["const"] == SCHEMA_ID


async def test_the_envelope_carries_ids_digests_findings_and_a_derived_trace_link():
    outcome = await execute_promptfoo_eval(
        attempt_id="fatt_crm_refund_001", final_output="Refund A-42", trajectory_digest="sha256:" + "0" * 64,
        source_trace_id=SOURCE, backend="native",
        assertions=[{"type": "contains", "value": "A-42"}, {"type": "contains", "value": "refund"}],
    )
    envelope = validate_framework_result(outcome.framework_result.to_json())
    assert envelope.attempt_id == "fatt_crm_refund_001" and envelope.status == "succeeded"
    assert [(f.kind, f.path, f.assertion_type, f.outcome) for f in envelope.findings] == [
        ("assertion", "assert[0]", "contains", "passed"),
        ("assertion", "assert[1]", "contains", "failed"),
        ("overall", "test", None, "failed"),
    ]
    assert envelope.overall.score == 0.5 and outcome.score == 0.5 and outcome.passed is False
    assert envelope.digests.trajectory == "sha256:" + "0" * 64
    assert envelope.digests.final_output.startswith("sha256:") and envelope.digests.native_bundle.startswith("sha256:")
    (link,) = envelope.trace_links
    assert link.source_trace_id == SOURCE and link.relation == "derived_from"
    assert len(link.evaluator_trace_id) == 32 and link.evaluator_trace_id != SOURCE
    assert link.transform_digest.startswith("sha256:")
    assert envelope.mappings == ["final_output_assertions"]


async def test_attempt_ids_take_the_fatt_form():
    plain = await execute_promptfoo_eval(attempt_id="ep-1", final_output="x", assertions=[], backend="native")
    odd = await execute_promptfoo_eval(attempt_id="ep 1/ä", final_output="x", assertions=[], backend="native")
    assert plain.framework_result.attempt_id == "fatt_ep-1" and plain.attempt_id == "ep-1"
    assert odd.framework_result.attempt_id.startswith("fatt_ep_1") and odd.framework_result.attempt_label == "ep 1/ä"
    validate_framework_result(odd.framework_result)


async def test_digests_change_with_what_was_graded():
    async def digests(output, value):
        outcome = await execute_promptfoo_eval(attempt_id="t", final_output=output, backend="native",
                                               assertions=[{"type": "contains", "value": value}])
        return outcome.framework_result.digests
    a, b, c = await digests("A-42", "A"), await digests("A-43", "A"), await digests("A-42", "4")
    assert a.final_output != b.final_output and a.assertions == b.assertions
    assert a.assertions != c.assertions and a.final_output == c.final_output


def test_validation_names_what_is_wrong():
    with pytest.raises(InvalidFrameworkResultError, match="schema"):
        validate_framework_result({"attempt_id": "fatt_x"})
    with pytest.raises(ValueError, match="never the source"):
        TraceLink(source_trace_id=SOURCE, evaluator_trace_id=SOURCE, transform_digest="sha256:" + "0" * 64)


async def test_an_errored_finding_with_a_score_or_a_reused_trace_id_is_rejected():
    outcome = await execute_promptfoo_eval(attempt_id="t", final_output="x", source_trace_id=SOURCE, backend="native",
                                           assertions=[{"type": "contains", "value": ""}])
    data = outcome.framework_result.to_json()
    data["findings"][-1]["score"] = 0.0
    with pytest.raises(InvalidFrameworkResultError, match="no score"):
        validate_framework_result(data)
    data = outcome.framework_result.to_json()
    data["trace_links"][0]["evaluator_trace_id"] = SOURCE
    with pytest.raises(InvalidFrameworkResultError, match="never the source"):
        validate_framework_result(data)


async def test_the_evaluator_trace_id_is_new_even_when_the_random_source_collides(monkeypatch):
    draws = iter([SOURCE, SOURCE, "b" * 32])
    monkeypatch.setattr(outcome_module.secrets, "token_hex", lambda n: next(draws))
    outcome = await execute_promptfoo_eval(attempt_id="t", final_output="x", source_trace_id=SOURCE,
                                           assertions=[], backend="native")
    assert outcome.framework_result.trace_links[0].evaluator_trace_id == "b" * 32


async def test_each_grading_run_gets_its_own_evaluator_trace():
    outcomes = await grade_cases([{"attempt_id": f"r{i}", "final_output": "x", "source_trace_id": SOURCE, "assertions": []}
                                  for i in range(5)], backend="native")
    ids = {o.framework_result.trace_links[0].evaluator_trace_id for o in outcomes}
    assert len(ids) == 5 and SOURCE not in ids


async def test_no_source_trace_means_no_trace_link():
    outcome = await execute_promptfoo_eval(attempt_id="t", final_output="x", assertions=[], backend="native")
    assert outcome.framework_result.trace_links == []


async def test_artifacts_are_written_side_by_side(tmp_path):
    outcome = await execute_promptfoo_eval(attempt_id="t", final_output="x", source_trace_id=SOURCE, backend="native",
                                           assertions=[{"type": "contains", "value": "x"}])
    written = outcome.write_artifacts(tmp_path / "ep")
    assert json.loads(written["native_bundle"].read_text()) == outcome.native_bundle
    validate_framework_result(json.loads(written["framework_result"].read_text()))
    unsupported = await execute_promptfoo_eval(attempt_id="t", final_output="x", backend="native",
                                               assertions=[{"type": "llm-rubric", "value": "polite"}])
    assert set(unsupported.write_artifacts(tmp_path / "u")) == {"framework_result"}


# -- result statuses --------------------------------------------------------------------------------


async def grade_one(assertions, backend="native", **extra):
    return await execute_promptfoo_eval(attempt_id="t", final_output="done", assertions=assertions, backend=backend, **extra)


def assert_errored(outcome, status, text):
    assert outcome.status == status, (outcome.status, outcome.error)
    assert text in outcome.error and outcome.reason == outcome.error
    assert outcome.score is None and outcome.passed is False
    assert outcome.framework_result.overall.outcome == "errored"
    validate_framework_result(outcome.framework_result)


async def test_a_malformed_assertion_is_invalid_input_and_points_at_it():
    outcome = await grade_one([{"type": "contains", "value": "done"}, {"type": "starts-with", "value": ""}])
    assert_errored(outcome, "invalid_input", "starts-with")
    assert [(f.path, f.outcome) for f in outcome.framework_result.findings] == [
        ("assert[0]", "skipped"), ("assert[1]", "errored"), ("test", "errored")]
    assert outcome.native_bundle["results"]["results"][0]["failureReason"] == 2


async def test_missing_steps_or_measurements_are_missing_evidence():
    assert_errored(await grade_one([{"type": "trajectory:tool-used", "value": "x"}]), "missing_evidence", "No trace data")
    assert_errored(await grade_one([{"type": "latency", "threshold": 10}]), "missing_evidence", "latency_ms")
    assert_errored(await grade_one([{"type": "cost", "threshold": 1}]), "missing_evidence", "cost")
    graded = await grade_one([{"type": "trajectory:tool-used", "value": "crm.*"}], steps=STEPS)
    assert graded.status == "succeeded" and graded.framework_result.mappings == ["trajectory_step_assertions"]


async def test_types_outside_the_native_set_without_the_cli_are_unsupported_not_an_abort(monkeypatch):
    monkeypatch.setenv("SOFTPROBE_PROMPTFOO", "/nonexistent/promptfoo")
    cases = [
        {"attempt_id": "good", "final_output": "A-42", "assertions": [{"type": "contains", "value": "A-42"}]},
        {"attempt_id": "rubric", "final_output": "A-42", "assertions": [{"type": "contains", "value": "A"},
                                                                         {"type": "llm-rubric", "value": "polite"}]},
        {"attempt_id": "js", "final_output": "A-42", "assertions": [{"type": "javascript", "value": "true"}]},
        {"attempt_id": "unknown", "final_output": "A-42", "assertions": [{"type": "no-such-type"}]},
    ]
    good, rubric, js, unknown = await grade_cases(cases)
    assert good.status == "succeeded" and good.passed
    for outcome, kind in ((rubric, "llm-rubric"), (js, "javascript"), (unknown, "no-such-type")):
        assert_errored(outcome, "unsupported", repr(kind))
        assert "promptfoo CLI is not installed" in outcome.error
    assert [(f.path, f.outcome) for f in rubric.framework_result.findings] == [
        ("assert[0]", "skipped"), ("assert[1]", "errored"), ("test", "errored")]


async def test_a_missing_cli_is_a_runner_error(monkeypatch):
    monkeypatch.setenv("SOFTPROBE_PROMPTFOO", "/nonexistent/promptfoo")
    assert_errored(await grade_one([{"type": "contains", "value": "d"}], backend="cli"), "runner_error", "not installed")


async def test_a_crashing_cli_is_a_runner_error_for_each_rollout_it_held(tmp_path, monkeypatch):
    monkeypatch.setenv("SOFTPROBE_PROMPTFOO", fake_cli(tmp_path, "echo 'boom' >&2; exit 3\n"))
    outcomes = await grade_cases([{"attempt_id": f"r{i}", "final_output": "x", "assertions": []} for i in range(3)],
                                 backend="cli")
    for outcome in outcomes:
        assert_errored(outcome, "runner_error", "exit code 3")
        assert "boom" in outcome.error and outcome.native_bundle is None


async def test_a_hanging_cli_is_timed_out(tmp_path, monkeypatch):
    monkeypatch.setenv("SOFTPROBE_PROMPTFOO", fake_cli(tmp_path, "exec sleep 30\n"))
    assert_errored(await grade_one([], backend="cli", cli_timeout_s=0.5), "timed_out", "did not finish within 0.5s")


async def test_no_processes_left_is_resource_exhausted(tmp_path, monkeypatch):
    monkeypatch.setenv("SOFTPROBE_PROMPTFOO", fake_cli(tmp_path, "exit 0\n"))

    async def no_more_processes(*args, **kwargs):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", no_more_processes)
    assert_errored(await grade_one([], backend="cli"), "resource_exhausted", "Resource temporarily unavailable")


async def test_a_rollout_that_broke_is_graded_as_its_failure_without_running_anything(monkeypatch):
    monkeypatch.setattr(evaluate_module, "grade_native", lambda case: pytest.fail("graded a broken rollout"))
    broken, cancelled = await grade_cases([
        EvalCase(attempt_id="b", final_output="", assertions=[{"type": "contains", "value": "x"}],
                 subject_failure=SubjectFailure(reason="EpisodeBrokenError: the container died")),
        EvalCase(attempt_id="c", final_output="", assertions=[],
                 subject_failure=SubjectFailure(status="cancelled", reason="interrupted")),
    ])
    assert_errored(broken, "subject_error", "container died")
    assert_errored(cancelled, "cancelled", "interrupted")
    single = await execute_promptfoo_eval(attempt_id="s", final_output="", assertions=[],
                                          subject_failure={"reason": "the shim stopped answering"})
    assert_errored(single, "subject_error", "shim stopped answering")


def test_every_status_is_in_the_schema():
    assert set(framework_result_schema()["properties"]["status"]["enum"]) == set(RESULT_STATUSES)
    assert len(RESULT_STATUSES) == 9


# -- describe_runner and requested mappings ----------------------------------------------------------


def test_describe_runner_says_which_mappings_each_backend_supports(monkeypatch):
    monkeypatch.setenv("SOFTPROBE_PROMPTFOO", "/nonexistent/promptfoo")
    native = describe_runner("native")
    assert native.trajectory_assertion_mapping == {"final_output_assertions": "supported",
                                                   "trajectory_step_assertions": "supported",
                                                   "historic_otlp_as_eval": "unsupported"}
    assert native.available and native.version.startswith("softprobe-native")
    assert "contains" in native.native_assertion_types and "llm-rubric" not in native.native_assertion_types
    cli = describe_runner("cli")
    assert not cli.available and cli.version is None
    assert cli.trajectory_assertion_mapping["trajectory_step_assertions"] == "unsupported"
    auto = describe_runner("auto")
    assert auto.supports("trajectory_step_assertions") and not auto.supports("historic_otlp_as_eval")


async def test_an_unsupported_mapping_is_refused_before_anything_runs(tmp_path, monkeypatch):
    log = tmp_path / "calls.log"
    monkeypatch.setenv("SOFTPROBE_PROMPTFOO", fake_cli(tmp_path, f"echo call >> {log}\nexit 1\n"))
    monkeypatch.setattr(evaluate_module, "grade_native", lambda case: pytest.fail("graded before refusing"))
    with pytest.raises(UnsupportedMappingError, match="historic traces alone are never an evaluation") as caught:
        await grade_one([{"type": "contains", "value": "d"}], backend="auto", requested_mappings=["historic_otlp_as_eval"])
    assert (caught.value.mapping, caught.value.backend) == ("historic_otlp_as_eval", "auto")
    with pytest.raises(UnsupportedMappingError, match="trajectory_step_assertions"):
        await grade_one([{"type": "contains", "value": "d"}], backend="cli",
                        requested_mappings=["final_output_assertions", "trajectory_step_assertions"])
    with pytest.raises(UnsupportedMappingError, match="unknown mapping 'otel'"):
        await grade_one([], requested_mappings=["otel"])
    assert not log.exists()


async def test_supported_mappings_are_recorded_in_the_envelope():
    outcome = await grade_one([{"type": "contains", "value": "d"}],
                              requested_mappings=["final_output_assertions", "trajectory_step_assertions"])
    assert outcome.status == "succeeded"
    assert outcome.framework_result.mappings == ["final_output_assertions", "trajectory_step_assertions"]
