"""SECURITY.md, row by row: what an episode container withstands with the default settings.

"Survives" means: a clear typed error or a truthful observation, the host and every other
episode keep working, nothing leaks, and the next step or reset works. Rows 12, 13 and 16 also
have deeper tests elsewhere (named in each row's docstring). Row 18 (deep checkpoint chains) is
tested only in test_checkpoint_depth.py, against the real engine: a fast test that flattens at a
lowered threshold and keeps the world, and a slow one of 135 generations at the default threshold
(a row here could only have restated the constant).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
from faulty_docker import FaultyDockerProxy
from helpers import SUPPORT_DESK, owned_by_process, processes, ready, this_process, tool

from softprobe.gym import EpisodeBrokenError, create_host_environment
from softprobe.gym import labels as L
from softprobe.gym.providers.docker.direct_channel import CONTAINER_SOCKET, FOLDER_PREFIX

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("episode_runtime")]  # row 40: runc and runsc


def shell(command: str, **extra: object) -> dict:
    return tool("shell.exec", command=command, **extra)


def py(code: str) -> dict:
    return shell(f"python3 -c {shlex.quote(code)}")


def container_of(episode_id: str) -> docker.models.containers.Container:
    client = docker.from_env()
    (container,) = client.containers.list(all=True, filters=this_process(f"{L.EPISODE}={episode_id}"))
    return container


async def still_works(host, episode_id: str) -> None:
    result = await host.step(episode_id=episode_id, action=shell("echo alive"))
    assert result.observation == "alive\n" and result.error is None


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_row_01_fork_bomb(host, tmp_path, episode_runtime):
    """Under gVisor the limit is RLIMIT_NPROC on the episode's uid (see docs/security.md); a bomb of 256
    processes keeps gVisor's kernel so busy that Docker's own calls about the container can time
    out, so that run uses a lower limit."""
    if episode_runtime != "runsc":
        await _fork_bomb(host)
        return
    async with create_host_environment(
        run_root=tmp_path / "low", image=SUPPORT_DESK, tool_timeout_s=20, container={"pids_limit": 32}
    ) as low:
        await _fork_bomb(low)


async def _fork_bomb(host) -> None:  # type: ignore[no-untyped-def]
    episode_id = await ready(host)
    started = time.monotonic()
    bomb = await host.step(episode_id=episode_id, action=shell("bomb() { bomb | bomb; }; bomb", timeout_s=5))
    assert bomb.error is not None and bomb.error.type in ("timeout", "command_failed")
    assert any(s in bomb.diagnostics["output"] for s in ("Cannot fork", "Resource temporarily unavailable"))  # pids limit
    assert time.monotonic() - started < 5 + 15  # ends within its timeout (plus the shim's grace)
    background = await host.step(episode_id=episode_id, action=shell("bomb() { bomb | bomb & }; bomb"))
    # The shell exits at once (unless the bomb fills the pids limit before its own second fork:
    # then it fails "Cannot fork"); either way the sweep kills the bomb.
    assert background.error is None or "Cannot fork" in background.error.message, background.error
    listing = await processes(host, episode_id)
    assert len(listing.splitlines()) < 10, listing
    await still_works(host, episode_id)
    await host.destroy(episode_id=episode_id)


async def test_row_02_memory_bomb(tmp_path, docker_engine, episode_runtime):
    async with create_host_environment(run_root=tmp_path, image=SUPPORT_DESK, container={"memory": "128m"}) as host:
        episode_id = await ready(host)
        bomb = py("x = [bytearray(1 << 20) for _ in range(4096)]")
        if episode_runtime == "runsc":
            # gVisor's kernel lives in the container's memory cgroup: the host kills the whole
            # sandbox, and the episode is reported broken because it ran out of memory.
            with pytest.raises(EpisodeBrokenError, match="ran out of memory"):
                await host.step(episode_id=episode_id, action=bomb)
            await host.reset(episode_id=episode_id)
        else:
            result = await host.step(episode_id=episode_id, action=bomb)
            assert result.error.type == "out_of_memory" and result.diagnostics["exit_code"] in (-9, 137)
            assert "timeout" not in result.observation
        await still_works(host, episode_id)


async def test_row_03_filling_tmp_or_the_workspace_is_bounded(tmp_path, docker_engine):
    settings = {"max_file_size": "8m", "tmp_size": "16m"}
    async with create_host_environment(run_root=tmp_path, image=SUPPORT_DESK, container=settings) as host:
        episode_id = await ready(host)
        big = await host.step(episode_id=episode_id, action=shell("head -c 100000000 /dev/zero > big"))
        assert big.error.type == "file_too_large"
        size = await host.step(episode_id=episode_id, action=shell("wc -c < big"))
        assert int(size.observation) == 8 * 1024 * 1024
        written = await host.step(episode_id=episode_id, action=tool("fs.write", path="w.txt", content="x" * (9 << 20)))
        assert written.error.type == "file_too_large"
        fill_tmp = await host.step(
            episode_id=episode_id,
            action=shell("for i in 1 2 3; do head -c 7000000 /dev/zero > /tmp/f$i || exit 9; done"),
        )
        assert fill_tmp.error.type == "command_failed" and "No space left" in fill_tmp.error.message
        await still_works(host, episode_id)
    default = create_host_environment(run_root=tmp_path / "d", image=SUPPORT_DESK).config.container
    assert (default.max_file_size, default.tmp_size) == ("1g", "256m")


async def test_row_04_cpu_burn_is_held_to_its_quota(host):
    burner, other = await ready(host, "burner"), await ready(host, "other")
    container = container_of(burner)
    before = container.stats(stream=False)["cpu_stats"]["cpu_usage"]["total_usage"]
    wall = time.monotonic()
    burn = asyncio.create_task(host.step(episode_id=burner, action=shell("while :; do :; done & while :; do :; done", timeout_s=3)))
    latencies = []
    while not burn.done():
        started = time.perf_counter()
        result = await host.step(episode_id=other, action=tool("fs.read", path="hello.txt"))
        latencies.append(time.perf_counter() - started)
        assert result.error is None
    await burn
    used_s = (container.stats(stream=False)["cpu_stats"]["cpu_usage"]["total_usage"] - before) / 1e9
    cores = used_s / (time.monotonic() - wall)
    assert cores <= 1.25, f"two busy loops got {cores:.2f} cores; the quota is 1"
    latencies.sort()
    print(f"\n[row 4] burner used {cores:.2f} cores; neighbour fs.read p50 {latencies[len(latencies) // 2] * 1000:.2f} ms "
          f"over {len(latencies)} steps")


async def test_row_05_stdout_flood_keeps_host_memory_flat(host, episode_runtime):
    episode_id = await ready(host)
    await host.step(episode_id=episode_id, action=shell("echo warm-up"))
    flood_bytes = 1_000_000_000 if episode_runtime == "runsc" else 3_000_000_000  # gVisor pipes: ~30 MB/s
    before = rss_kib()
    flood = await host.step(episode_id=episode_id, action=shell(f"yes softprobe-flood | head -c {flood_bytes}", timeout_s=120))
    after = rss_kib()
    assert flood.diagnostics["output_bytes"] == flood_bytes and flood.diagnostics["output_truncated"]
    assert "bytes of output truncated" in flood.observation and len(flood.observation) < (1 << 20) + 200
    assert after - before < 50 * 1024, f"host RSS grew {after - before} KiB"
    print(f"\n[row 5] {flood_bytes / 1e9:g} GB flood: host RSS {before} KiB before, {after} KiB after")


async def test_row_06_zombies_and_orphans_are_reaped(host):
    episode_id = await ready(host)
    code = "import os\nfor _ in range(20):\n    if os.fork() == 0:\n        os._exit(0)\nif os.fork() == 0:\n    os.setsid(); os.execvp('sleep', ['sleep', '300'])\n"
    made = await host.step(episode_id=episode_id, action=py(code))
    assert made.error is None
    listing = await processes(host, episode_id)
    states = await host.step(episode_id=episode_id, action=shell("cat /proc/[0-9]*/stat 2>/dev/null | awk '{print $3}' | sort | uniq -c"))
    assert " Z" not in states.observation, states.observation
    assert "sleep 300" not in listing


async def test_row_07_privileged_kernel_interfaces_are_refused(host, episode_runtime):
    episode_id = await ready(host)
    probes = {
        "sysrq": "open('/proc/sysrq-trigger', 'w').write('b')",
        "mount": "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
                 "r = libc.mount(b'none', b'/mnt', b'tmpfs', 0, None); raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno())) if r else None",
        "unshare": "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
                   "r = libc.unshare(0x10000000); raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno())) if r else None",
        "raw socket (ping)": "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)",
    }
    refusals = ("Operation not permitted", "Read-only file system", "Permission denied")
    if episode_runtime == "runsc":
        # gVisor lets a process make a user namespace inside its own kernel; it grants nothing
        # outside the sandbox. The probe then shows that even there mount stays refused.
        probes["unshare"] = (
            "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); libc.unshare(0x10000000); "
            "r = libc.mount(b'none', b'/etc', b'tmpfs', 0, None); "
            "raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno())) if r else SystemExit('mounted!')"
        )
    for name, code in probes.items():
        result = await host.step(episode_id=episode_id, action=py(code))
        assert result.error is not None, name
        said = result.error.message + result.diagnostics.get("output", "")
        # Some kernels have no sysrq-trigger at all: refused just the same.
        allowed = refusals + (("No such file or directory",) if name == "sysrq" else ())
        assert any(e in said for e in allowed), (name, result)
    await still_works(host, episode_id)


async def test_row_08_setuid_escalation_fails(host):
    episode_id = await ready(host)
    status = await host.step(episode_id=episode_id, action=shell(
        "grep -E '^(CapEff|Uid)' /proc/self/status; "
        "python3 -c 'import ctypes; print(\"NoNewPrivs:\", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'"  # PR_GET_NO_NEW_PRIVS
    ))
    assert "NoNewPrivs: 1" in status.observation and "CapEff:\t0000000000000000" in status.observation
    su = await host.step(episode_id=episode_id, action=shell("su -c id root < /dev/null; id -u"))
    assert int(su.observation.strip().splitlines()[-1]) >= 1 << 20  # still the episode's uid
    setuid = await host.step(episode_id=episode_id, action=py("import os; os.setuid(0)"))
    assert setuid.error.type == "command_failed" and "Operation not permitted" in setuid.diagnostics["output"]


async def test_row_09_no_network_egress(host):
    episode_id = await ready(host)
    interfaces = await host.step(episode_id=episode_id, action=shell("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"))
    assert interfaces.observation.split() == ["lo"]
    routes = await host.step(episode_id=episode_id, action=shell("tail -n +2 /proc/net/route | wc -l"))
    assert routes.observation.strip() == "0"  # no default route: nothing can leave, no packet is sent
    dns = await host.step(episode_id=episode_id, action=py("import socket; socket.getaddrinfo('example.com', 443)"))
    assert dns.error is not None and "gaierror" in dns.diagnostics["output"]


async def test_row_10_episodes_cannot_reach_each_other(host, episode_runtime):
    first, second = await ready(host, "first"), await ready(host, "second")
    if episode_runtime == "runsc":
        # Each container is a sandbox with a kernel of its own: its namespaces are that kernel's
        # (the same inode numbers in every sandbox), so show the kernels instead.
        for episode_id in (first, second):
            kernel = await host.step(episode_id=episode_id, action=shell("dmesg | head -1"))
            assert "gVisor" in kernel.observation, kernel
            assert container_of(episode_id).attrs["HostConfig"]["Runtime"] == "runsc"
    else:
        namespaces = []
        for episode_id in (first, second):
            ns = await host.step(episode_id=episode_id, action=shell("readlink /proc/self/ns/net /proc/self/ns/pid /proc/self/ns/ipc"))
            namespaces.append(ns.observation.split())
        assert all(a != b for a, b in zip(*namespaces, strict=True)), namespaces
    for episode_id in (first, second):
        assert container_of(episode_id).attrs["HostConfig"]["NetworkMode"] == "none"


async def test_row_11_no_host_secrets_inside(host, monkeypatch, episode_runtime):
    monkeypatch.setenv("SOFTPROBE_HOST_SECRET", "hunter2")
    episode_id = await ready(host)
    env = await host.step(episode_id=episode_id, action=shell("cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'"))
    assert "hunter2" not in env.observation and "SOFTPROBE_HOST_SECRET" not in env.observation
    sock = await host.step(episode_id=episode_id, action=shell("ls /var/run/docker.sock /run/docker.sock"))
    assert sock.error is not None
    mounts = container_of(episode_id).attrs["Mounts"]
    # No volumes and no host files (Docker's own /etc/hosts etc. aside): under runc one socket
    # file only, read-only, the direct channel's (SECURITY.md rows 96-99), from a folder of ours.
    assert all(m["Type"] == "bind" and m["Destination"] == CONTAINER_SOCKET and not m["RW"]
               and os.path.basename(os.path.dirname(m["Source"])).startswith(FOLDER_PREFIX) for m in mounts), mounts
    assert len(mounts) == (0 if episode_runtime == "runsc" else 1), mounts


async def test_row_12_path_traversal_in_file_tools(host):
    """Deeper: test_tools.py::test_file_tools_refuse_to_leave_the_workspace, test_shim_unit.py."""
    episode_id = await ready(host)
    await host.step(episode_id=episode_id, action=shell("ln -s / root-link"))
    for action in [tool("fs.read", path="../../etc/passwd"), tool("fs.read", path="/etc/passwd"),
                   tool("fs.read", path="root-link/etc/passwd"), tool("fs.write", path="root-link/tmp/x", content="x")]:
        result = await host.step(episode_id=episode_id, action=action)
        assert result.error.type == "path_outside_workspace"
    planted = await host.step(episode_id=episode_id, action=shell("test -e /tmp/x; echo $?"))
    assert planted.observation.strip() == "1"


async def test_row_13_tar_slip_on_copy_out(host, episode_runtime):
    """Deeper: test_archive.py (crafted archives)."""
    episode_id = await ready(host)
    await host.step(episode_id=episode_id, action=shell("ln -s / root; ln -s ../../../../etc/passwd up; mkfifo pipe; echo ok > ok.txt"))
    done = await host.finalize(episode_id=episode_id)
    skipped = sorted(s.path for s in done.skipped_paths)
    if episode_runtime == "runsc" and "workspace/pipe" not in skipped:
        # gVisor keeps a FIFO in its own kernel: the archive never holds it.
        assert not (done.workspace_path / "pipe").exists()
        skipped.insert(0, "workspace/pipe")
    assert skipped == ["workspace/pipe", "workspace/root", "workspace/up"]
    assert (done.workspace_path / "ok.txt").read_text() == "ok\n"
    outside = [p for p in done.episode_dir.parent.parent.rglob("*") if not str(p.resolve()).startswith(str(done.episode_dir.parent.parent.resolve()))]
    assert outside == []


async def test_row_14_malformed_actions(host):
    """Deeper: test_actions.py and the hypothesis fuzz in test_fuzz.py."""
    from softprobe.gym import InvalidActionError

    episode_id = await ready(host)
    deep: dict = {}
    for _ in range(200):
        deep = {"d": deep}
    for bad in [None, 42, "rm -rf /", {"type": "tool", "name": "fs.read", "args": "x"},
                {"type": "tool", "name": "fs.write", "args": {"path": "a", "content": "\udcff"}},
                {"type": "tool", "name": "fs.write", "args": deep}]:
        with pytest.raises(InvalidActionError):
            await host.step(episode_id=episode_id, action=bad)
    odd = await host.step(episode_id=episode_id, action=tool("fs.read", path="x" * 5000))
    assert odd.error.type in ("not_found", "io_error")
    await still_works(host, episode_id)


async def test_row_15_the_shim_or_container_dies_mid_step(host):
    # From inside, the shim cannot be killed (row 15b); these are deaths from outside.
    client = docker.from_env()
    for how in ("kill the shim process", "kill the container"):
        episode_id = await ready(host, how.replace(" ", "-"))
        container = container_of(episode_id)
        step = asyncio.create_task(host.step(episode_id=episode_id, action=shell("sleep 30")))
        await asyncio.sleep(0)  # let the step send its request; the kill may land before or after
        if how == "kill the shim process":
            container.reload()
            os.kill(container.attrs["State"]["Pid"], signal.SIGKILL)  # the shim, seen from the host
        else:
            container.kill()
        with pytest.raises(EpisodeBrokenError, match="broken"):
            await asyncio.wait_for(step, 20)
        await host.destroy(episode_id=episode_id)
        assert client.containers.list(all=True, filters=this_process(f"{L.EPISODE}={episode_id}")) == []
    client.close()


async def test_row_15b_tool_processes_cannot_forge_or_kill_the_shim(host):
    """Not a SECURITY.md row, but its premise: the agent's code runs as the shim's uid."""
    episode_id = await ready(host)
    forge = (
        "import os, signal\n"
        "out = []\n"
        "for pid in ('1',):\n"
        "    try:\n"
        "        open('/proc/%s/fd/1' % pid, 'w').write('{\"id\": 2, \"ok\": true, \"result\": {}}\\n')\n"
        "        out.append('forged')\n"
        "    except OSError as err:\n"
        "        out.append(type(err).__name__)\n"
        "    try:\n"
        "        os.kill(int(pid), signal.SIGKILL)\n"
        "    except OSError as err:\n"
        "        out.append(type(err).__name__)\n"
        "print(' '.join(out))\n"
    )
    attempt = await host.step(episode_id=episode_id, action=py(forge))
    assert attempt.error is None and attempt.observation.startswith("PermissionError"), attempt
    assert "forged" not in attempt.observation
    hello = host.runtime_of(episode_id=episode_id).hello
    assert hello.pid == 1 and hello.hardened
    await still_works(host, episode_id)  # SIGKILL to the namespace's init from inside is ignored
    listing = await processes(host, episode_id)
    assert listing.splitlines()[0].startswith("1 ") and "agent_shim.pyz" in listing.splitlines()[0]


async def test_row_16_a_sigkilled_host_leaves_nothing_gc_cannot_find(tmp_path, host):
    """Deeper: test_gc.py (an unrelated container survives; the start-up sweep)."""
    child = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "orphan_host.py"), str(tmp_path), SUPPORT_DESK],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready", child.stderr.read()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close(), child.stderr.close()

    def mine() -> list[str]:
        return owned_by_process(child.pid)[0]

    assert len(mine()) == 3
    done = subprocess.run([sys.executable, "-m", "softprobe.gym.cli", "gc"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and mine() == []


async def test_row_17_transient_docker_errors_are_retried_and_actions_never_twice(tmp_path, docker_engine):
    with FaultyDockerProxy(tmp_path / "docker.sock", http_500=2, resets=2) as proxy:
        async with create_host_environment(run_root=tmp_path / "run", image=SUPPORT_DESK, docker_host=proxy.url) as host:
            episode_id = await ready(host)
            assert proxy.failed == 4  # every injected failure was met, and retried past
            for _ in range(3):
                step = await host.step(episode_id=episode_id, action=shell("echo ran >> counter.txt"))
                assert step.error is None
            proxy.http_500 = 1  # a control-plane call after the steps fails once more
            count = await host.step(episode_id=episode_id, action=shell("wc -l < counter.txt"))
            assert count.observation.strip() == "3"  # no action ran twice
            done = await host.finalize(episode_id=episode_id)
            assert proxy.failed == 5 and (done.workspace_path / "counter.txt").read_text() == "ran\n" * 3
