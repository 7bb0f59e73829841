"""`softprobe-gym bench --quick --json` runs, reports every measurement, and leaves nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import docker
import pytest

from softprobe.gym import labels as L

pytestmark = pytest.mark.docker


def labelled(client: docker.DockerClient) -> tuple[set[str], set[str]]:
    containers = {c.id for c in client.containers.list(all=True, filters={"label": L.MANAGED})}
    images = {i.id for i in client.images.list(filters={"label": L.CHECKPOINT})}
    return containers, images


def test_quick_bench_reports_every_row_as_json_and_leaves_nothing(docker_engine):
    client = docker.from_env()
    before = labelled(client)
    done = subprocess.run([sys.executable, "-m", "softprobe.gym.cli", "bench", "--quick", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    names = [row["name"] for row in report["rows"]]
    for expected in ["step fs.read (200 B file)", "step shell.exec true", "reset, cold (new container + seed)",
                     "reset, warm (from the pool)", "checkpoint", "fork, prefix re-execution N=10",
                     "fork, checkpoint import", "8 episodes stepping at once",
                     "step after a 1-file change, 10,000-file workspace", "memory of an idle episode (median of 8)",
                     "support-desk training rollout + finalize"]:
        assert expected in names
    assert all(row["ours_p50"] > 0 and row["samples"] > 0 for row in report["rows"])
    assert labelled(client) == before
    client.close()
