"""The direct channel (SECURITY.md rows 96-99a): where the engine is local Linux the host speaks
to the shim over a unix socket of its own, named in each step's diagnostics; gVisor, and a host
told so, stay on attach. The agent, the tool uid and a root agent cannot connect to the socket,
list, replace or fill its folder, and the host's side of it is gone once the shim connected."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import BASE, host_containers, ready, tool

from softprobe.gym import HostEnvironment, create_host_environment
from softprobe.gym.providers.docker.direct_channel import CHANNEL_ENV, CONTAINER_SOCKET, ChannelListener

pytestmark = pytest.mark.docker

FOLDER = os.path.dirname(CONTAINER_SOCKET)

# Everything an agent could try against the socket and its folder; one line per attempt, each
# "name:ok" or "name:<the error's class>".
ATTACK = f"""
import json, os, socket, sys
attempts = {{
    "list": lambda: os.listdir({FOLDER!r}),
    "stat": lambda: os.stat({CONTAINER_SOCKET!r}),
    "connect": lambda: socket.socket(socket.AF_UNIX).connect({CONTAINER_SOCKET!r}),
    "remove": lambda: os.unlink({CONTAINER_SOCKET!r}),
    "replace": lambda: os.rename(planted, {CONTAINER_SOCKET!r}),
    "fill": lambda: open({FOLDER!r} + "/filler", "wb").write(b"x" * 4096),
    "bind": lambda: socket.socket(socket.AF_UNIX).bind({FOLDER!r} + "/other.sock"),
    "open": lambda: open(os.path.join({FOLDER!r}, "shim.sock"), "wb"),
    "chmod": lambda: os.chmod({FOLDER!r}, 0o777),
}}
planted = "/tmp/planted-%d" % os.getuid()
open(planted, "w").write("planted")
out = {{}}
for name, attempt in attempts.items():
    try:
        attempt()
        out[name] = "ok"
    except OSError as err:
        out[name] = type(err).__name__
print(json.dumps(out))
"""

# A tool of the world, run under the tool uid, that runs whatever it is given.
TOOLS = [{
    "name": "evil.run",
    "args": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    "command": ["python3", "-c", "import json, sys; exec(json.load(sys.stdin)['code'])"],
}]


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[HostEnvironment]:
    env = create_host_environment(run_root=tmp_path / "run", image=BASE, tools=TOOLS)
    try:
        yield env
    finally:
        await env.close()
        assert not host_containers(env), "the host left containers behind"


def _mount_source(host: HostEnvironment, episode_id: str) -> str | None:
    """Where the episode container's socket comes from on the host (None: no socket mounted)."""
    runtime = host.runtime_of(episode_id=episode_id)
    assert runtime is not None
    attrs = host.provider.client.api.inspect_container(runtime.sandbox.sandbox_id)  # type: ignore[attr-defined]
    sources = [m["Source"] for m in attrs["Mounts"] if m["Destination"] == CONTAINER_SOCKET]
    return sources[0] if sources else None


KILLED_HOST = """
import asyncio, json, os, sys
sys.path.insert(0, {tests!r})
from helpers import BASE, ready
from softprobe.gym import create_host_environment

async def main():
    host = create_host_environment(run_root={run_root!r}, image={image!r})
    episode_id = await ready(host)
    runtime = host.runtime_of(episode_id=episode_id)
    attrs = host.provider.client.api.inspect_container(runtime.sandbox.sandbox_id)
    print(json.dumps([m["Source"] for m in attrs["Mounts"]]), flush=True)
    os._exit(0)  # no clean-up: as a host that was killed

asyncio.run(main())
"""


def _run_killed_host(tmp_path: Path, image: str = BASE, **env: str) -> str | None:
    """Run a host that dies without cleaning up; the folder of its container's socket (None:
    none mounted)."""
    code = KILLED_HOST.format(tests=str(Path(__file__).parents[1]), run_root=str(tmp_path / "killed"), image=image)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, **env})
    sources = json.loads(ran.stdout.strip().splitlines()[-1])
    return os.path.dirname(sources[0]) if sources else None


async def test_a_child_of_a_checkpoint_never_names_its_parents_folder(tmp_path, docker_engine):
    # A checkpoint image carries its parent container's labels: a child that stays on attach
    # must not inherit the parent's folder, or a sweep of the child would remove it under the
    # running parent (whose finalize needs it: Docker's archive copies mount it again).
    caps = {"environment_checkpoint": True}
    async with create_host_environment(run_root=tmp_path / "parent", image=BASE, capabilities=caps) as parent:
        episode_id = await ready(parent, "parent")
        source = _mount_source(parent, episode_id)
        assert source is not None
        checkpoint = await parent.checkpoint(episode_id=episode_id)
        image = parent.provider.client.api.inspect_image(checkpoint.image_id)  # type: ignore[attr-defined]
        assert _run_killed_host(tmp_path, image["Id"], **{CHANNEL_ENV: "attach"}) is None
        async with create_host_environment(run_root=tmp_path / "next", image=BASE) as sweeper:
            await ready(sweeper)  # sweeps the dead host's child
        assert os.path.isdir(os.path.dirname(source))
        done = await parent.finalize(episode_id=episode_id)
        assert done.workspace_path.is_dir()


async def test_an_engine_that_refuses_the_mount_leaves_the_provider_on_attach(tmp_path, monkeypatch, docker_engine):
    # As an engine that cannot see this host's temp folder (a remote context, a private /tmp):
    # the bind source does not exist there. The start goes on over attach, and so do later ones.
    from docker.types import Mount

    def unseen(self):  # type: ignore[no-untyped-def]
        return Mount(CONTAINER_SOCKET, os.path.join(self.folder, "unseen.sock"), type="bind", read_only=True)

    monkeypatch.setattr(ChannelListener, "mount", unseen)
    before = _own_folders()
    async with create_host_environment(run_root=tmp_path, image=BASE) as host:
        for episode_id in ("first", "second"):
            await ready(host, episode_id)
            step = await host.step(episode_id=episode_id, action=tool("fs.list"))
            assert step.error is None and step.diagnostics["channel"] == "attach", step
            assert _mount_source(host, episode_id) is None
        assert host.provider.direct_channel is False  # type: ignore[attr-defined]
    assert _own_folders() <= before  # the refused start's folder went with it


def _own_folders() -> set[str]:
    """This process's channel folders (other tests of the process may hold some)."""
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(f"softprobe-channel-{os.getpid()}-")}


async def _attack(host: HostEnvironment, episode_id: str, action: dict[str, object]) -> dict[str, str]:
    result = await host.step(episode_id=episode_id, action=action)
    assert result.error is None, result
    observation = result.observation
    return json.loads(observation if isinstance(observation, str) else json.dumps(observation))


async def test_a_step_names_its_channel_and_the_hosts_socket_goes_with_the_container(tmp_path, episode_runtime):
    async with create_host_environment(run_root=tmp_path, image=BASE) as host:
        episode_id = await ready(host)
        step = await host.step(episode_id=episode_id, action=tool("fs.list"))
        expected = "attach" if episode_runtime == "runsc" else "direct"
        assert step.error is None and step.diagnostics["channel"] == expected, step
        source = _mount_source(host, episode_id)
        if expected == "attach":
            assert source is None  # gVisor cannot mount a host socket: nothing is tried
            return
        assert source is not None
        folder = os.path.dirname(source)
        assert os.stat(folder).st_mode & 0o777 == 0o700 and os.listdir(folder) == ["shim.sock"]
        # The listener closed right after the handshake: no one connects any more, the host neither.
        with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(source)
        await host.finalize(episode_id=episode_id)
        await host.destroy(episode_id=episode_id)
        assert not os.path.exists(folder)  # removed with the container


async def test_a_sweep_removes_the_socket_folder_a_dead_host_left(tmp_path, docker_engine):
    # A host killed mid-episode leaves its container; the next sweep removes it and its folder.
    left = _run_killed_host(tmp_path)
    assert left is not None and os.path.isdir(left)
    async with create_host_environment(run_root=tmp_path / "next", image=BASE) as host:
        await ready(host)  # the first use sweeps what dead hosts left
    assert not os.path.exists(left)


async def test_a_host_told_to_stays_on_attach(tmp_path, monkeypatch, docker_engine):
    monkeypatch.setenv(CHANNEL_ENV, "attach")
    async with create_host_environment(run_root=tmp_path, image=BASE) as host:
        episode_id = await ready(host)
        step = await host.step(episode_id=episode_id, action=tool("fs.list"))
        assert step.diagnostics["channel"] == "attach" and _mount_source(host, episode_id) is None


async def test_the_agent_and_the_tool_uid_cannot_reach_the_socket(host):
    episode_id = await ready(host)
    refused = {"list": "PermissionError", "stat": "PermissionError", "connect": "PermissionError",
               "remove": "PermissionError", "replace": "PermissionError", "fill": "PermissionError",
               "bind": "PermissionError", "open": "PermissionError", "chmod": "PermissionError"}
    as_agent = await _attack(host, episode_id, tool("shell.exec", command=f"python3 -c {shlex.quote(ATTACK)}"))
    assert as_agent == refused
    as_tool = await _attack(host, episode_id, tool("evil.run", code=ATTACK))
    assert as_tool == refused
    # The channel carries on as before.
    step = await host.step(episode_id=episode_id, action=tool("fs.write", path="after.txt", content="still here"))
    assert step.error is None and step.diagnostics["channel"] == "direct"


async def test_a_root_agent_finds_the_socket_closed_and_cannot_replace_it(tmp_path, docker_engine):
    # A world whose agent is root (user "0", with the shim's capabilities) may enter the folder, which is
    # root's: the listener is closed, and the socket is a read-only mount no one can move.
    async with create_host_environment(run_root=tmp_path, image=BASE, container={"user": "0"}) as host:
        episode_id = await ready(host)
        got = await _attack(host, episode_id, tool("shell.exec", command=f"python3 -c {shlex.quote(ATTACK)}"))
        assert got["connect"] == "ConnectionRefusedError", got
        assert got["remove"] == got["replace"] == "OSError", got  # EBUSY: a mount point
        assert got["open"] == "OSError", got  # ENXIO: a socket is not a file
        step = await host.step(episode_id=episode_id, action=tool("fs.list"))
        assert step.error is None and step.diagnostics["channel"] == "direct"


async def test_only_the_socket_crosses_and_read_only(host):
    # What even the container's root sees of the host: one socket file, mounted read-only, whose
    # folder on the host holds nothing else and is the host's only (mode 0700).
    episode_id = await ready(host)
    ran = await host.run_process(episode_id=episode_id, user="root", argv=[
        "sh", "-c", f"ls -A {FOLDER}; grep ' {FOLDER}' /proc/self/mountinfo"])
    assert ran.returncode == 0, ran
    listed, *mounts = ran.stdout.decode().splitlines()
    assert listed == "shim.sock"
    assert len(mounts) == 1 and mounts[0].split()[4] == CONTAINER_SOCKET, mounts
    assert "ro" in mounts[0].split()[5].split(","), mounts


async def test_a_shim_that_gives_up_still_tells_why(host):
    # Stderr stays on attach: a shim that ends over the socket leaves its last words there.
    episode_id = await ready(host)
    channel = host.runtime_of(episode_id=episode_id).sandbox.channel  # type: ignore[union-attr]
    assert channel.kind == "direct"
    await channel.send_line(b'{"id": 7, "op": "hello", "raw": -1}')  # content of no length: the shim gives up
    with pytest.raises(EOFError):
        await channel.recv_line()
    assert "giving up: a request announced raw content of -1 bytes" in channel.diagnostics()
