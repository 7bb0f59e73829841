"""`softprobe-gym grade` and `eval` grading outputs: both artifacts per episode, result statuses,
errored attempts counted apart and never scored 0. Records are written by hand: no engine needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from softprobe.promptfoo_adapter import validate_framework_result


def run_grade(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "softprobe.gym.cli", "grade", *args], capture_output=True, text=True,
                          timeout=300, **kwargs)


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def fake_episode(run_root, episode_id, *, output, tool="crm.get_account", terminated_reason="terminate_action"):
    folder = run_root / "episodes" / episode_id
    folder.mkdir(parents=True)
    steps = [{"episode_id": episode_id, "index": 1, "action": {"type": "tool", "name": tool, "args": {"id": "A-42"}},
              "observation": {"id": "A-42"}},
             {"episode_id": episode_id, "index": 2, "action": {"type": "terminate", "output": output},
              "observation": "", "terminated": True}]
    rollout = {"episode_id": episode_id, "steps": steps, "final_output": output, "trajectory_digest": "sha256:" + "1" * 64,
               "source_trace_id": TRACE, "total_reward": 0.0, "terminated_reason": terminated_reason,
               "artifacts_dir": str(folder), "workspace_path": str(folder / "workspace")}
    (folder / "rollout.json").write_text(json.dumps(rollout))
    (folder / "result.json").write_text("{}")
    return folder


def test_grade_writes_both_artifacts_per_episode_and_reports_statuses(tmp_path):
    run_root = tmp_path / "run"
    good = fake_episode(run_root, "good", output="Refund issued for A-42")
    wrong = fake_episode(run_root, "wrong", output="Refund issued for A-7", tool="fs.read")
    broken = fake_episode(run_root, "broken", output="", terminated_reason="error")
    spec = tmp_path / "assert.yaml"
    spec.write_text("- {type: contains, value: A-42}\n- {type: trajectory:tool-used, value: crm.get_account}\n")

    done = run_grade(str(run_root), "--assert", str(spec), "--backend", "native")
    assert done.returncode == 1, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()[2:5]}
    assert " pass " in lines["good"] and " FAIL " in lines["wrong"]
    assert " ERROR " in lines["broken"] and "subject_error: the rollout of broken stopped on an error" in lines["broken"]
    assert lines["broken"].split()[2] == "-"  # no score, never 0
    assert "1 passed, 1 failed, 1 errored (subject_error: 1)" in done.stdout

    for folder in (good, wrong):
        bundle = json.loads((folder / "promptfoo.native.json").read_text())
        envelope = validate_framework_result(json.loads((folder / "framework-result.json").read_text()))
        assert bundle["results"]["results"][0]["testCase"]["metadata"]["sourceTraceId"] == TRACE
        assert envelope.attempt_id == f"fatt_{folder.name}" and envelope.status == "succeeded"
        assert envelope.trace_links[0].source_trace_id == TRACE != envelope.trace_links[0].evaluator_trace_id
    assert not (broken / "promptfoo.native.json").exists()
    assert validate_framework_result(json.loads((broken / "framework-result.json").read_text())).status == "subject_error"

    as_json = run_grade(str(run_root), "--assert", str(spec), "--json", "--backend", "native")
    rows = {r["attempt_id"]: r for r in map(json.loads, as_json.stdout.splitlines())}
    assert (rows["broken"]["status"], rows["broken"]["score"], rows["broken"]["passed"]) == ("subject_error", None, False)
    assert rows["good"]["artifacts"] == {"native_bundle": str(good / "promptfoo.native.json"),
                                         "framework_result": str(good / "framework-result.json")}


def test_grade_grades_the_rest_when_the_grader_cannot_and_exits_2(tmp_path):
    run_root = tmp_path / "run"
    fake_episode(run_root, "a", output="A-42")
    spec = tmp_path / "assert.yaml"
    spec.write_text("- {type: llm-rubric, value: is polite}\n")
    done = run_grade(str(run_root), "--assert", str(spec), env={**os.environ, "SOFTPROBE_PROMPTFOO": "/nonexistent/promptfoo"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unsupported: " in done.stdout and "'llm-rubric'" in done.stdout
    envelope = validate_framework_result(json.loads((run_root / "episodes" / "a" / "framework-result.json").read_text()))
    assert envelope.status == "unsupported" and envelope.overall.score is None


async def test_eval_counts_errored_tasks_apart_and_never_scores_them_0(tmp_path):
    from softprobe.gym.evals.runner import TaskRecord, grade_records
    from softprobe.gym.evals.suite import load_suite

    suite_path = tmp_path / "suite.yaml"
    suite_path.write_text("name: s\ntasks:\n" + "".join(
        f"  - id: {name}\n    actions: [{{type: terminate}}]\n    assert:\n      - {{type: contains, value: A-42}}\n"
        for name in ("good", "wrong", "broken")))
    suite = load_suite(suite_path)
    out = tmp_path / "out"
    (out / "tasks").mkdir(parents=True)
    for name, output in (("good", "A-42"), ("wrong", "A-7")):
        folder = fake_episode(tmp_path / "run", name, output=output)
        rollout = json.loads((folder / "rollout.json").read_text())
        taped = {"tape_mode": "replay", "tape": "/tapes/good", "run_level": "recorded_external"} if name == "good" else {}
        record = TaskRecord(id=name, ok=True, duration_ms=5.0, rollout=rollout, **taped)
        (out / "tasks" / f"{name}.json").write_text(record.model_dump_json())
    broken = TaskRecord(id="broken", ok=False, error="EpisodeBrokenError: the container died", duration_ms=5.0)
    (out / "tasks" / "broken.json").write_text(broken.model_dump_json())

    outcome = await grade_records(suite, out, suite.tasks, backend="native", wall_s=1.0, interrupted=False)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["ran"], summary["passed"], summary["failed"], summary["errored"]) == (3, 1, 1, 1)
    assert summary["status_counts"]["succeeded"] == 2 and summary["status_counts"]["subject_error"] == 1
    assert set(summary["status_counts"]) >= {"invalid_input", "runner_error", "cancelled"}
    assert summary["score"]["graded"] == 2 and summary["score"]["mean"] == 0.5  # not (1 + 0 + 0) / 3
    results = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert (results["broken"]["status"], results["broken"]["score"]) == ("subject_error", None)
    assert "container died" in results["broken"]["error"]
    assert results["good"]["grading"] == {"framework_result": "grading/good/framework-result.json",
                                          "native_bundle": "grading/good/promptfoo.native.json"}
    for name in ("good", "wrong", "broken"):
        validate_framework_result(json.loads((out / "grading" / name / "framework-result.json").read_text()))
    assert not (out / "grading" / "broken" / "promptfoo.native.json").exists()
    report = (out / "report.html").read_text()
    assert 'href="grading/good/promptfoo.native.json"' in report and 'href="grading/good/framework-result.json"' in report
    assert "subject_error: 1" in report
    # A task that replayed a tape says so, with its run level; one without a tape says nothing of it.
    assert report.count(" · tape ") == 1 and " · tape replay /tapes/good · run level recorded_external" in report
    assert outcome.summary == summary
