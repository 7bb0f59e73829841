"""The secure defaults of an episode container, seen from Docker and from inside."""

from __future__ import annotations

import os

import docker
import pytest
from helpers import SUPPORT_DESK, ready, this_process, tool

from softprobe.gym import create_host_environment
from softprobe.gym import labels as L

pytestmark = pytest.mark.docker


def inspect(episode_id: str) -> dict:
    client = docker.from_env()
    try:
        (container,) = client.containers.list(filters=this_process(f"{L.EPISODE}={episode_id}"))
        return container.attrs
    finally:
        client.close()


async def test_docker_confines_the_container_by_default(host):
    episode_id = await ready(host)
    attrs = inspect(episode_id)
    config, host_config = attrs["Config"], attrs["HostConfig"]
    assert host_config["NetworkMode"] == "none"
    assert host_config["CapDrop"] == ["ALL"]
    assert host_config["SecurityOpt"] == ["no-new-privileges:true"]
    assert host_config["Init"] is False  # the shim is PID 1 (and reaps orphans itself)
    assert host_config["PidsLimit"] == 256
    assert host_config["Memory"] == host_config["MemorySwap"] == 1024**3
    assert host_config["NanoCpus"] == 1_000_000_000
    assert {u["Name"]: u["Hard"] for u in host_config["Ulimits"]} == {"nofile": 1024, "core": 0, "fsize": 1024**3}
    assert host_config["Tmpfs"] == {"/tmp": "rw,nosuid,nodev,size=256m,mode=1777"}
    assert host_config["LogConfig"]["Type"] == "none"
    assert host_config["Binds"] in (None, [])
    assert host_config["Privileged"] is False
    # The shim is container-root with only what it needs to drop privileges for every tool.
    assert config["User"] == "0"
    assert [c.removeprefix("CAP_") for c in sorted(host_config["CapAdd"])] == [
        "CHOWN", "DAC_READ_SEARCH", "FOWNER", "KILL", "SETGID", "SETUID"]
    assert config["Entrypoint"][:3] == ["python3", "-I", "-u"]
    assert int(config["Labels"][L.AGENT_UID]) >= 1 << 20
    labels = config["Labels"]
    assert labels[L.EPISODE] == episode_id and labels[L.OWNER] == L.current_owner()
    assert labels[L.HOST] == host.host_id and labels[L.MANAGED] == "true"


async def test_inside_the_container_the_agent_has_no_privileges_network_or_host_secrets(host, monkeypatch):
    monkeypatch.setenv("SOFTPROBE_TEST_HOST_SECRET", "hunter2")
    episode_id = await ready(host, "inside")
    probe = (
        "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; ulimit -n; ulimit -c; "
        "env; ls /var/run/docker.sock 2>&1; "
        "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)' 2>&1 | tail -1"
    )
    result = await host.step(episode_id=episode_id, action=tool("shell.exec", command=probe))
    out = result.observation
    assert int(out.splitlines()[0]) >= 1 << 20  # the episode's own uid, not the host user's
    assert "CapEff:\t0000000000000000" in out and "NoNewPrivs:\t1" in out
    assert "\n1024\n0\n" in out
    assert "hunter2" not in out and "SOFTPROBE_TEST_HOST_SECRET" not in out
    assert "No such file" in out  # no docker socket inside
    assert "Network is unreachable" in out or "OSError" in out


async def test_setuid_and_privileged_operations_fail(host):
    episode_id = await ready(host, "privs")
    result = await host.step(
        episode_id=episode_id,
        action=tool("shell.exec", command="echo b > /proc/sysrq-trigger; touch /etc/owned; exit 0"),
    )
    assert "Read-only file system" in result.observation or "Permission denied" in result.observation
    check = await host.step(episode_id=episode_id, action=tool("shell.exec", command="test -e /etc/owned; echo $?"))
    assert check.observation.strip() == "1"


async def test_out_of_memory_is_reported_as_such(tmp_path, docker_engine):
    async with create_host_environment(
        run_root=tmp_path, image=SUPPORT_DESK, container={"memory": "96m"}
    ) as host:
        episode_id = await ready(host)
        bomb = "python3 -c 'x = [bytearray(1 << 20) for _ in range(4096)]'"
        result = await host.step(episode_id=episode_id, action=tool("shell.exec", command=bomb))
        assert result.error.type == "out_of_memory", result
        assert result.diagnostics["exit_code"] in (-9, 137)
        assert "out-of-memory" in result.observation
        after = await host.step(episode_id=episode_id, action=tool("shell.exec", command="echo alive"))
        assert after.observation == "alive\n"


async def test_relaxations_are_explicit_options(tmp_path, docker_engine):
    settings = {"network": "bridge", "memory": "256m", "pids_limit": 64, "environment": {"MODE": "x"}}
    async with create_host_environment(run_root=tmp_path, image=SUPPORT_DESK, container=settings) as host:
        episode_id = await ready(host)
        host_config = inspect(episode_id)["HostConfig"]
        assert host_config["NetworkMode"] == "bridge"
        assert host_config["Memory"] == 256 * 1024**2 and host_config["PidsLimit"] == 64
        env = await host.step(episode_id=episode_id, action=tool("shell.exec", command="echo $MODE"))
        assert env.observation == "x\n"
        assert os.environ.get("MODE") != "x"
