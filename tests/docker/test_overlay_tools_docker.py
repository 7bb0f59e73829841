"""Tools without an image build in real containers: the overlay lands in /opt/softprobe/overlay,
root's and read-only to the agent and the tool uid, and comes back after a warm-pool reset and
a checkpoint import. The overlay op's logic is tested on the local provider
(tests/unit/test_overlay_tools.py)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from bundle_fixtures import write_bundle_folder
from helpers import ALL_CAPS, BASE, NullSubject, host_containers, tool

from softprobe.gym import HostEnvironment, create_host_environment

pytestmark = pytest.mark.docker

OVERLAY = "/opt/softprobe/overlay"

REFUND = '''
import json, os, sys
args = json.load(sys.stdin)
rates = json.load(open(os.path.join(os.environ["SOFTPROBE_OVERLAY"], "data", "rates.json")))
print(json.dumps({"refunded": args["amount"] * rates["factor"], "uid": os.getuid()}))
'''

TOOLS = [
    {
        "name": "billing.refund",
        "args": {"type": "object", "properties": {"amount": {"type": "number"}}, "required": ["amount"]},
        "command": ["python3", "${SOFTPROBE_OVERLAY}/refund.py"],
        "output": "json",
    },
    {
        # A tool that turns on the overlay: it runs under the tool uid.
        "name": "evil.tamper",
        "args": {"type": "object", "properties": {"script": {"type": "string"}}, "required": ["script"]},
        "command": ["python3", "-c", "import json, subprocess, sys; "
                    "sys.exit(subprocess.call(['/bin/sh', '-c', json.load(sys.stdin)['script']]))"],
    },
]





@pytest.fixture
def tool_files(tmp_path: Path) -> Path:
    folder = tmp_path / "overlay-src"
    (folder / "data").mkdir(parents=True)
    (folder / "refund.py").write_text(REFUND)
    (folder / "data" / "rates.json").write_text('{"factor": 2}')
    (folder / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (folder / "run.sh").chmod(0o775)
    return folder


async def _host(tmp_path: Path, tool_files: Path, **kwargs: object) -> AsyncIterator[HostEnvironment]:
    host = create_host_environment(run_root=tmp_path / "run", image=BASE, tools=TOOLS, tool_files=tool_files,
                                   tool_timeout_s=20, **kwargs)
    try:
        yield host
    finally:
        await host.close()
        assert not host_containers(host), "the host left containers behind"


@pytest.fixture
async def host(tmp_path: Path, tool_files: Path) -> AsyncIterator[HostEnvironment]:
    async for env in _host(tmp_path, tool_files):
        yield env


async def _sh(host: HostEnvironment, episode_id: str, command: str):  # type: ignore[no-untyped-def]
    return await host.step(episode_id=episode_id, action=tool("shell.exec", command=command))


async def test_an_overlay_tool_runs_in_a_container_under_the_tool_uid(host):
    await host.create_episode(episode_id="ep")
    reset = await host.reset(episode_id="ep")
    assert {"billing.refund", "evil.tamper"} <= set(reset.observation["tools"])
    result = await host.step(episode_id="ep", action=tool("billing.refund", amount=21))
    assert result.error is None, result
    hello = host.runtime_of(episode_id="ep").hello
    assert result.observation == {"refunded": 42, "uid": hello.tool_uid}
    assert hello.tool_uid not in (0, hello.uid)
    listing = await _sh(host, "ep", f"cd {OVERLAY} && stat -c '%a %u %n' . data data/rates.json refund.py run.sh")
    assert listing.observation.splitlines() == [
        "755 0 .", "755 0 data", "644 0 data/rates.json", "644 0 refund.py", "755 0 run.sh",
    ]
    specs = {s.name: s for s in await host.tool_specs(episode_id="ep")}
    assert specs["billing.refund"].as_function()["function"]["name"] == "billing__refund"


ATTACKS = [
    f"echo hacked >> {OVERLAY}/refund.py",
    f"echo hacked > {OVERLAY}/refund.py",
    f"rm -f {OVERLAY}/refund.py",
    f"chmod 777 {OVERLAY}/refund.py",
    f"chmod 777 {OVERLAY}",
    # A rename within one filesystem (the workspace's, the container's root): only the folder's
    # permissions stand in its way.
    f"cd /workspace && echo 'print(1)' > evil.py && mv -f evil.py {OVERLAY}/refund.py",
    f"ln -sf /tmp/evil.py {OVERLAY}/refund.py",
    f"touch {OVERLAY}/new.py",
    f"mkdir {OVERLAY}/data/more",
    f"mv {OVERLAY}/data {OVERLAY}/moved",
    f"mv {OVERLAY} /tmp/overlay",
    "mv /opt/softprobe /tmp/softprobe",
    "ln -s /tmp /opt/softprobe/overlay2",
    f"chown $(id -u) {OVERLAY}/refund.py",
]

FINGERPRINT = f"cd {OVERLAY} && find . -exec stat -c '%a %u %g %F %n' {{}} + | sort && cat refund.py data/rates.json"


async def test_neither_the_agent_nor_a_tool_can_change_the_overlay(host):
    await host.create_episode(episode_id="ep")
    await host.reset(episode_id="ep")
    before = (await _sh(host, "ep", FINGERPRINT)).observation
    assert "refund.py" in before
    for attack in ATTACKS:
        as_agent = await _sh(host, "ep", attack)
        assert as_agent.error is not None and as_agent.error.type == "command_failed", (attack, as_agent)
        as_tool = await host.step(episode_id="ep", action=tool("evil.tamper", script=attack))
        assert as_tool.error is not None and as_tool.error.type == "tool_failed", (attack, as_tool)
    assert (await _sh(host, "ep", FINGERPRINT)).observation == before
    result = await host.step(episode_id="ep", action=tool("billing.refund", amount=1))
    assert result.error is None and result.observation["refunded"] == 2


async def test_overlay_tools_survive_a_warm_pool_reset_and_checkpoint_import(tmp_path, tool_files):
    async for host in _host(tmp_path, tool_files, pool_size=1, capabilities=ALL_CAPS, subject=NullSubject()):
        await host.warm_up()
        assert host.pool is not None and host.pool.ready == 1
        pooled = host.pool._ready[0].sandbox_id
        await host.create_episode(episode_id="parent")
        await host.reset(episode_id="parent")
        assert host.runtime_of(episode_id="parent").sandbox_id == pooled
        first = await host.step(episode_id="parent", action=tool("billing.refund", amount=1))
        assert first.error is None and first.observation["refunded"] == 2
        ckpt = await host.checkpoint(episode_id="parent")

        child = await host.fork(episode_id="parent", path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)
        again = await host.step(episode_id=child.episode_id, action=tool("billing.refund", amount=3))
        assert again.error is None and again.observation["refunded"] == 6
        # The image holds the parent's overlay; the child's shim made it afresh, just as sealed.
        tamper = await _sh(host, child.episode_id, f"touch {OVERLAY}/new.py")
        assert tamper.error is not None
        run = await _sh(host, child.episode_id, f"{OVERLAY}/run.sh")
        assert run.error is None and run.observation == "ran\n"


VENDOR = '''
import json, os
key = open(os.path.join(os.environ["SOFTPROBE_OVERLAY"], "secrets", "api_key")).read().strip()
print(json.dumps({"read": True, "tail": key[-4:]}))
'''
SECRET = "sk-live-5f2a9c1234"
KEY = f"{OVERLAY}/secrets/api_key"
# What an agent tries with any command: read it, copy it, archive it, open it from a program.
SECRET_ATTACKS = [
    f"cat {KEY}",
    f"cp {KEY} /workspace/k && cat /workspace/k",
    f"dd if={KEY} status=none",
    f"python3 -c \"print(open('{KEY}').read())\"",
    f"tar cf /tmp/s.tar -C {OVERLAY} secrets && tar xOf /tmp/s.tar",
    f"cd {OVERLAY}/secrets && head -c 100 api_key",
]


def _vendor_source(folder: Path) -> Path:
    (folder / "secrets").mkdir(parents=True)
    (folder / "vendor.py").write_text(VENDOR)
    key = folder / "secrets" / "api_key"
    key.write_text(SECRET + "\n")
    key.chmod(0o600)  # the author keeps it from others: the tool's, not the agent's
    (folder / "notes.md").write_text("readable by all\n")
    return folder


@pytest.mark.parametrize("source", ["tool_files", "bundle"])
async def test_a_private_overlay_file_is_readable_by_its_tool_never_by_the_agent(tmp_path, episode_runtime, source):
    """Attack: a world author's 0600 file (an API key an overlay tool needs) was installed 0644
    and ``shell.exec`` printed it. Now the tool uid alone reads it (root's, group the tool gid,
    0640); the agent sees its name, never its content."""
    files = _vendor_source(tmp_path / "src")
    vendor = {"name": "vendor.call", "command": ["python3", "${SOFTPROBE_OVERLAY}/vendor.py"], "output": "json"}
    if source == "bundle":
        folder = tmp_path / "bundle"
        shutil.copytree(files, folder / "tools")  # copytree keeps the 0600
        write_bundle_folder(
            folder, "schema: softprobe.environment-bundle/v1\nname: private-key\nimage: softprobe/base:latest\n"
            "overlay:\n  files: tools\n  tools:\n    - {name: vendor.call, command: [python3, "
            "'${SOFTPROBE_OVERLAY}/vendor.py'], output: json}\n")
        host = create_host_environment(run_root=tmp_path / "run", bundle=folder)
    else:
        host = create_host_environment(run_root=tmp_path / "run", image=BASE, tools=[vendor], tool_files=files)
    try:
        await host.create_episode(episode_id="ep")
        await host.reset(episode_id="ep")
        hello = host.runtime_of(episode_id="ep").hello
        # os.stat, not coreutils' stat: gVisor answers its statx with EINVAL.
        modes = await _sh(host, "ep", "python3 -c \"import os, sys\nfor p in sys.argv[1:]: s = os.stat(p); "
                          f"print('%o' % (s.st_mode & 0o7777), s.st_uid, s.st_gid, p)\" {KEY} {OVERLAY}/notes.md "
                          f"{OVERLAY}/vendor.py")
        assert modes.observation.splitlines() == [
            f"640 0 {hello.tool_uid} {KEY}", f"644 0 0 {OVERLAY}/notes.md", f"644 0 0 {OVERLAY}/vendor.py"], modes
        for attack in SECRET_ATTACKS:
            step = await _sh(host, "ep", attack)
            assert step.error is not None and step.error.type == "command_failed", (attack, step)
            assert SECRET[3:] not in str(step.observation), attack
        readable = await _sh(host, "ep", f"cat {OVERLAY}/notes.md")  # what the author let others read
        assert readable.error is None and readable.observation == "readable by all\n"
        used = await host.step(episode_id="ep", action=tool("vendor.call"))
        assert used.error is None and used.observation == {"read": True, "tail": SECRET[-4:]}, used
    finally:
        await host.close()
    assert not host_containers(host), "the host left containers behind"
