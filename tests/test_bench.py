"""`softprobe-gym bench --quick --json` runs, reports every measurement, and leaves nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import owned_by_process

pytestmark = pytest.mark.docker


def test_quick_bench_reports_every_row_as_json_and_leaves_nothing(docker_engine):
    # Only what the bench process itself created counts: other processes may share the engine.
    bench = subprocess.Popen([sys.executable, "-m", "softprobe.gym.cli", "bench", "--quick", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = bench.communicate(timeout=600)
    assert bench.returncode == 0, stderr
    report = json.loads(stdout)
    names = [row["name"] for row in report["rows"]]
    for expected in ["step fs.read (200 B file)", "step shell.exec true", "reset, cold (new container + seed)",
                     "reset, warm (from the pool)", "checkpoint", "fork, prefix re-execution N=10",
                     "fork, checkpoint import", "8 episodes stepping at once",
                     "step after a 1-file change, 10,000-file workspace", "memory of an idle episode (median of 8)",
                     "support-desk training rollout + finalize"]:
        assert expected in names
    assert all(row["ours_p50"] > 0 and row["samples"] > 0 for row in report["rows"])
    assert owned_by_process(bench.pid) == ([], [])
