"""Leftovers of a host process that was SIGKILLed are found by label and removed; nothing else is."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import docker
import pytest
from helpers import BASE, SUPPORT_DESK, networks_of_process, owned_by_process, ready, this_process
from testcontainers.core.container import DockerContainer

from softprobe.gym import labels as L

pytestmark = pytest.mark.docker
HERE = Path(__file__).parents[1]  # tests/, where orphan_host.py is


def start_orphan(tmp_path: Path) -> subprocess.Popen:
    """Run orphan_host.py until it has episodes and a checkpoint."""
    child = subprocess.Popen(
        [sys.executable, str(HERE / "orphan_host.py"), str(tmp_path / "orphan-run"), SUPPORT_DESK, "--world"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()  # blocks until the child says it is ready (or dies)
    if line.strip() != "ready":
        child.kill()
        raise AssertionError(f"orphan host failed: {child.stderr.read()}")
    return child


def gc(*args: str) -> dict:
    """Run ``softprobe-gym gc --json``; what it removed (or would remove)."""
    done = subprocess.run(
        [sys.executable, "-m", "softprobe.gym.cli", "gc", "--json", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_gc_removes_what_a_sigkilled_host_left_and_nothing_else(tmp_path, host):
    client = docker.from_env()
    live_episode = await ready(host, "live")  # owned by this (living) process: must be kept
    with DockerContainer(BASE).with_command("sleep 600") as unrelated:
        child = start_orphan(tmp_path)
        containers, images = owned_by_process(child.pid)  # counted while it lives: nobody sweeps it
        assert len(containers) == 3 + 2 and len(images) == 1  # three episodes, one world of agent + service
        assert len(networks_of_process(child.pid)) == 1
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close(), child.stderr.close()

        # On a shared engine another process's host may sweep the orphan at any moment too, so
        # only what is still there after each gc run is checked (it cannot come back).
        planned = gc("--dry-run")
        left_containers, left_images = owned_by_process(child.pid)
        assert set(left_containers) <= set(planned["removed_containers"])
        assert set(left_images) <= set(planned["removed_images"])
        assert set(networks_of_process(child.pid)) <= set(planned["removed_networks"])

        gc()
        assert owned_by_process(child.pid) == ([], []) and networks_of_process(child.pid) == []

        unrelated_container = unrelated.get_wrapped_container()
        unrelated_container.reload()
        assert unrelated_container.status == "running"
        live = client.containers.list(filters=this_process(f"{L.EPISODE}={live_episode}"))
        assert len(live) == 1
    client.close()


async def test_a_new_host_sweeps_dead_owners_on_first_use(tmp_path, host):
    child = start_orphan(tmp_path)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close(), child.stderr.close()
    assert owned_by_process(child.pid)[0]
    await ready(host, "sweeper")  # the first reset of a host sweeps
    assert owned_by_process(child.pid) == ([], []) and networks_of_process(child.pid) == []
