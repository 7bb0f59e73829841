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
from testcontainers.core.container import DockerContainer

from helpers import BASE, SUPPORT_DESK, ready
from softprobe.gym import labels as L

pytestmark = pytest.mark.docker
HERE = Path(__file__).parent


def start_orphan(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """Run orphan_host.py until it has episodes and a checkpoint; return it and its owner id."""
    child = subprocess.Popen(
        [sys.executable, str(HERE / "orphan_host.py"), str(tmp_path / "orphan-run"), SUPPORT_DESK],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()  # blocks until the child says it is ready (or dies)
    if line.strip() != "ready":
        child.kill()
        raise AssertionError(f"orphan host failed: {child.stderr.read()}")
    return child, f"{L.OWNER}={os.uname().nodename}:{child.pid}:"


def gc(*args: str) -> dict:
    """Run ``softprobe-gym gc --json``; what it removed (or would remove)."""
    done = subprocess.run(
        [sys.executable, "-m", "softprobe.gym.cli", "gc", "--json", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def ids(objects: list) -> set[str]:
    return {o.id for o in objects}


def owned_by(client: docker.DockerClient, owner_prefix: str) -> tuple[list, list]:
    containers = [
        c for c in client.containers.list(all=True, filters={"label": L.MANAGED})
        if f"{L.OWNER}={c.labels.get(L.OWNER, '')}".startswith(owner_prefix)
    ]
    images = [
        i for i in client.images.list(filters={"label": L.CHECKPOINT})
        if f"{L.OWNER}={i.labels.get(L.OWNER, '')}".startswith(owner_prefix)
    ]
    return containers, images


async def test_gc_removes_what_a_sigkilled_host_left_and_nothing_else(tmp_path, host):
    client = docker.from_env()
    live_episode = await ready(host, "live")  # owned by this (living) process: must be kept
    with DockerContainer(BASE).with_command("sleep 600") as unrelated:
        child, owner = start_orphan(tmp_path)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close(), child.stderr.close()
        containers, images = owned_by(client, owner)
        assert len(containers) == 3 and len(images) == 1  # the orphan's leftovers

        # Other processes may share the engine (and leave their own dead owners' leftovers):
        # only the orphan's objects are checked, by id.
        planned = gc("--dry-run")
        assert ids(containers) <= set(planned["removed_containers"]) and ids(images) <= set(planned["removed_images"])
        assert owned_by(client, owner) == (containers, images)

        removed = gc()
        assert ids(containers) <= set(removed["removed_containers"]) and ids(images) <= set(removed["removed_images"])
        assert owned_by(client, owner) == ([], [])

        unrelated_container = unrelated.get_wrapped_container()
        unrelated_container.reload()
        assert unrelated_container.status == "running"
        live = client.containers.list(filters={"label": f"{L.EPISODE}={live_episode}"})
        assert len(live) == 1
    client.close()


async def test_a_new_host_sweeps_dead_owners_on_first_use(tmp_path, host):
    client = docker.from_env()
    child, owner = start_orphan(tmp_path)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close(), child.stderr.close()
    assert owned_by(client, owner)[0]
    await ready(host, "sweeper")  # the first reset of a host sweeps
    assert owned_by(client, owner) == ([], [])
    client.close()
