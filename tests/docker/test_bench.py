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
    from softprobe.gym.cli.bench import BenchReport, BenchRow, Comparison, format_comparison

    def report(fs_read: float) -> BenchReport:
        row = BenchRow(name="step fs.read (200 B file)", unit="ms", ours_p50=fs_read, samples=1)
        return BenchReport(image="img", quick=True, rows=[row])

    table = format_comparison(Comparison(image="img", quick=True, reports={"runc": report(0.5), "runsc": report(1.25)}))
    header, line = table.splitlines()[1], table.splitlines()[3]
    assert header.split()[-2:] == ["runc", "runsc"]
    assert line.split()[-2:] == ["0.500", "1.250"]


def test_channels_side_by_side_say_so():
    from softprobe.gym.cli.bench import BenchReport, BenchRow, Comparison, format_comparison

    rows = {name: BenchReport(image="img", quick=True, rows=[BenchRow(name="step", unit="ms", ours_p50=p50, samples=1)])
            for name, p50 in (("attach", 0.5), ("direct", 0.3))}
    table = format_comparison(Comparison(image="img", quick=True, compared="channels", reports=rows)).splitlines()
    assert table[0] == "softprobe-gym bench on img, channels side by side"
    assert table[1].split()[-2:] == ["attach", "direct"] and table[3].split()[-2:] == ["0.500", "0.300"]


def test_compare_channels_refuses_where_the_direct_one_cannot_be_used(docker_engine):
    bench = subprocess.run(
        [sys.executable, "-m", "softprobe.gym.cli", "bench", "--quick", "--runtime", "runsc", "--compare-channels"],
        capture_output=True, text=True, timeout=900,
    )
    assert bench.returncode == 1 and "--compare-channels needs the direct channel" in bench.stderr, bench.stderr
    assert "gVisor" in bench.stderr


def test_compare_runtimes_refuses_a_runtime_the_engine_lacks(docker_engine):
    bench = subprocess.run(
        [sys.executable, "-m", "softprobe.gym.cli", "bench", "--quick", "--compare-runtimes", "runc,no-such-runtime"],
        capture_output=True, text=True, timeout=900,
    )
    assert bench.returncode == 1 and "no-such-runtime" in bench.stderr and "daemon.json" in bench.stderr


def test_cpu_rows_give_each_process_per_step_and_the_floors_on_a_tiny_run(docker_engine, tmp_path):
    import asyncio
    import os

    from softprobe.gym.cli.bench_cpu import cpu_ratios, format_cpu, run_cpu_bench
    from softprobe.gym.providers.docker.cpu import PROCESSES

    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "small.txt").write_text("x" * 200)
    rows = asyncio.run(run_cpu_bench(image="softprobe/support-desk:latest", seed=seed, run_root=tmp_path / "run",
                                     steps=3, episodes=(1, 2)))
    by = {(row.name, row.episodes): row for row in rows}
    for k in (1, 2):
        for name in ("fs.read (200 B)", "shell.exec true", "declared tool crm.list_accounts",
                     "bare shim round trip (exists)", "docker exec cat (200 B)", "docker exec true"):
            row = by[(name, k)]
            assert row.steps == 3 * k and row.wall_ms > 0
            assert set(row.cpu_us) == {*PROCESSES, "total"}
            # The engine is this machine's: every process on the path is visible and counted.
            assert all(row.cpu_us[key] is not None for key in PROCESSES), row
        assert by[("shell.exec true", k)].cpu_us["container"] > 0  # the command ran in the container's cgroup
    floor = by[("in-container fork+exec true (Popen)", 1)]
    assert floor.kind == "floor" and floor.cpu_us["total"] > 0
    assert ("in-container fork+exec true (Popen)", 2) not in by
    for part in ("part: fork+exec sh -c true", "part: drop hop + sh -c true", "part: setpriv hop + sh -c true",
                 "part: a /proc walk (the full sweep's)", "part: the OOM counter read"):
        assert by[(part, 1)].kind == "part" and by[(part, 1)].cpu_us["total"] is not None, part
    assert "shell.exec true / in-container fork+exec true (Popen), k=1" in cpu_ratios(rows)
    table = format_cpu(rows)
    assert table[0].split()[-7:] == ["host", "dockerd", "ctrd", "ctrd-shim", "shim", "container", "total"]
    assert len(table) == 2 + len(rows) + 1
    assert owned_by_process(os.getpid()) == ([], [])
