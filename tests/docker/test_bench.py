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
                     "support-desk training rollout + finalize", "reset, cold, agent + 1 service (billing)",
                     "reset, warm, agent + 1 service (billing)"]:
        assert expected in names
    assert all(row["ours_p50"] > 0 and row["samples"] > 0 for row in report["rows"])
    assert owned_by_process(bench.pid) == ([], [])


def test_runtimes_side_by_side_share_one_table():
    from softprobe.gym.cli.bench import BenchReport, BenchRow, RuntimeComparison, format_comparison

    def report(fs_read: float) -> BenchReport:
        row = BenchRow(name="step fs.read (200 B file)", unit="ms", ours_p50=fs_read, samples=1)
        return BenchReport(image="img", quick=True, rows=[row])

    table = format_comparison(RuntimeComparison(image="img", quick=True, reports={"runc": report(0.5), "runsc": report(1.25)}))
    header, line = table.splitlines()[1], table.splitlines()[3]
    assert header.split()[-2:] == ["runc", "runsc"]
    assert line.split()[-2:] == ["0.500", "1.250"]


def test_compare_runtimes_refuses_a_runtime_the_engine_lacks(docker_engine):
    bench = subprocess.run(
        [sys.executable, "-m", "softprobe.gym.cli", "bench", "--quick", "--compare-runtimes", "runc,no-such-runtime"],
        capture_output=True, text=True, timeout=900,
    )
    assert bench.returncode == 1 and "no-such-runtime" in bench.stderr and "daemon.json" in bench.stderr
