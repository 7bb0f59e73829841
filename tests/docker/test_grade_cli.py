"""`softprobe-gym grade`: finished episodes under a run root, graded in one batch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import SUPPORT_DESK, ready, tool

from softprobe.gym import create_host_environment, create_training_session

pytestmark = pytest.mark.docker


def run_grade(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "softprobe.gym.cli", "grade", *args], capture_output=True, text=True, timeout=300)


async def test_grade_reports_each_finished_episode_and_exits_by_outcome(tmp_path, docker_engine):
    run_root = tmp_path / "run"
    async with create_host_environment(run_root=run_root, image=SUPPORT_DESK) as host:
        good = await ready(host, "good")
        await host.step(episode_id=good, action=tool("crm.get_account", id="A-42"))
        await host.step(episode_id=good, action={"type": "terminate", "output": "Refund issued for A-42"})
        await host.finalize(episode_id=good)
        session = create_training_session(host, episode_id="session-run")
        async for _ in session.rollout([tool("crm.get_account", id="A-7"), {"type": "terminate"}]):
            pass
        await session.finalize()
        await ready(host, "unfinished")  # no result.json: not graded
    spec = tmp_path / "assert.yaml"
    spec.write_text("assert:\n  - type: contains\n    value: A-42\n  - type: trajectory:tool-used\n    value: crm.get_account\n")

    done = run_grade(str(run_root), "--assert", str(spec))
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("good") and " pass " in line for line in lines)
    assert any(line.startswith("session-run") and " FAIL " in line for line in lines)
    assert "unfinished" not in done.stdout and "1 passed, 1 failed" in done.stdout

    as_json = run_grade(str(run_root), "--assert", str(spec), "--json", "--backend", "native")
    results = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [(r["attempt_id"], r["passed"]) for r in results] == [("good", True), ("session-run", False)]
    assert results[1]["source_trace_id"] and results[0]["trajectory_digest"].startswith("sha256:")
    # An episode outside a session is graded under the trace id its own records carry.
    recorded = json.loads((run_root / "episodes" / "good" / "result.json").read_text())["source_trace_id"]
    assert results[0]["source_trace_id"] == recorded

    spec.write_text("- type: contains\n  value: A-\n")
    assert run_grade(str(run_root), "--assert", str(spec)).returncode == 0


def test_grade_usage_errors_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("just: a mapping\n")
    done = run_grade(str(tmp_path), "--assert", str(bad))
    assert done.returncode == 2 and "must hold a list of assertions" in done.stderr
    good = tmp_path / "good.yaml"
    good.write_text("- type: contains\n  value: x\n")
    done = run_grade(str(tmp_path), "--assert", str(good))
    assert done.returncode == 2 and "no finished episodes" in done.stderr
