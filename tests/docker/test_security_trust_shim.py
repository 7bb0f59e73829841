"""SECURITY.md rows 19-24, 27, 30, 32-34 and 39: the trust boundary inside the container.

Each test does what an agent could do (any command, any file) and asserts the guarantee. The
host-side rows (25, 26, 28, 29, 31, 35-38) are in ``test_security_trust_host.py``.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shlex
from pathlib import Path

import docker
import pytest
from helpers import SUPPORT_DESK, processes, ready, tool

from softprobe.gym import create_host_environment
from softprobe.gym import labels as L
from softprobe.gym.errors import SandboxError
from softprobe.gym.shim import SHIM_SHA256

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("episode_runtime")]  # row 40: runc and runsc

ALL_CAPS = {"environment_checkpoint": True, "subject_state_import": True, "deterministic_prefix_reexecution": True}


def shell(command: str, **extra: object) -> dict:
    return tool("shell.exec", command=command, **extra)


def py(code: str, **extra: object) -> dict:
    return shell(f"python3 -c {shlex.quote(code)}", **extra)


def hello_of(host, episode_id: str):  # type: ignore[no-untyped-def]
    return host.runtime_of(episode_id=episode_id).hello


class Subject:
    def export_state(self, episode_id: str) -> dict:
        return {}

    def import_state(self, episode_id: str, state: dict) -> None:
        pass


# Code that would run in any Python that imports the agent's user site (or its folder): it
# leaves a marker and would forge every answer by replacing json.dumps.
PLANT = r"""
set -e
site=$(python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$site"
cat > "$site/usercustomize.py" <<'EOF'
import json, os
open('/workspace/PWNED-' + str(os.getpid()), 'w').write('planted code ran')
json.dumps = lambda *a, **k: '{"forged": true}'
EOF
cp "$site/usercustomize.py" "$site/sitecustomize.py"
echo 'import usercustomize' > "$site/zz-planted.pth"
cp "$site/usercustomize.py" /workspace/json.py
cp "$site/usercustomize.py" /workspace/sitecustomize.py
echo 'python3 -c "open(\"/workspace/PWNED-rc\", \"w\")"' >> "$HOME/.profile"
echo planted
"""


async def test_row_19_planted_code_never_runs_in_the_shim_or_a_declared_tool(tmp_path, docker_engine):
    async with create_host_environment(
        run_root=tmp_path, image=SUPPORT_DESK, capabilities=ALL_CAPS, subject=Subject()
    ) as host:
        parent = await ready(host, "parent")
        planted = await host.step(episode_id=parent, action=shell(PLANT))
        assert planted.observation.strip() == "planted", planted
        crm = await host.step(episode_id=parent, action=tool("crm.get_account", id="A-42"))
        assert crm.error is None and crm.observation["name"] == "Acme Rockets", crm
        ckpt = await host.checkpoint(episode_id=parent)
        child = await host.fork(episode_id=parent, path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)
        kid = child.episode_id
        hello = hello_of(host, kid)
        assert hello.shim_sha256 == SHIM_SHA256  # the child's shim is the library's own
        crm = await host.step(episode_id=kid, action=tool("crm.get_account", id="A-42"))
        assert crm.error is None and crm.observation["name"] == "Acme Rockets", crm
        listing = await host.step(episode_id=kid, action=tool("fs.list"))
        names = {entry["name"] for entry in listing.observation}
        # The planted files are there (they are the agent's), but nothing ever ran them.
        assert {"json.py", "sitecustomize.py"} <= names
        assert not [n for n in names if n.startswith("PWNED")], names


async def test_row_20_tools_run_under_other_uids_than_the_shim_and_cannot_reach_it(host):
    episode_id = await ready(host)
    hello = hello_of(host, episode_id)
    assert hello.shim_uid == 0 and hello.uid >= 1 << 20 and hello.tool_uid >= 1 << 20
    assert len({hello.shim_uid, hello.uid, hello.tool_uid}) == 3
    assert os.getuid() not in (hello.uid, hello.tool_uid)  # never the host user's
    probe = (
        "import ctypes, os, signal\n"
        "out = []\n"
        "for what, attempt in [\n"
        "    ('kill', lambda: os.kill(1, signal.SIGTERM)),\n"

        "    ('mem', lambda: open('/proc/1/mem', 'rb').read(1)),\n"
        "    ('fd', lambda: open('/proc/1/fd/1', 'wb')),\n"
        "]:\n"
        "    try:\n"
        "        attempt(); out.append(what + ':ok')\n"
        "    except OSError as err:\n"
        "        out.append(what + ':' + type(err).__name__)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "out.append('ptrace:%d' % libc.ptrace(16, 1, 0, 0))  # PTRACE_ATTACH\n"
        "print(' '.join(out))\n"
    )
    result = await host.step(episode_id=episode_id, action=py(probe))
    assert result.observation.split() == [
        "kill:PermissionError", "mem:PermissionError", "fd:PermissionError", "ptrace:-1",
    ], result
    whoami = await host.step(episode_id=episode_id, action=shell("id -u; grep CapEff /proc/self/status"))
    assert whoami.observation.split() == [str(hello.uid), "CapEff:", "0000000000000000"]


ESCAPERS = r"""
import ctypes, os, sys, threading, time

def writer(tag):
    while True:
        with open('/workspace/late.log', 'a') as f:
            f.write(tag + '\n')
        time.sleep(0.001)

# 1. double fork: the grandchild is reparented to PID 1
if os.fork() == 0:
    if os.fork() == 0:
        os.setsid(); writer('double-fork')
    os._exit(0)
# 2. a process that re-forks and lets its parent exit, over and over, leaving zombies behind
if os.fork() == 0:
    os.setsid()
    while True:
        pid = os.fork()
        if pid:
            os._exit(0)
        for _ in range(3):
            if os.fork() == 0:
                os._exit(0)  # zombies as padding (their parent never waits)
        with open('/workspace/late.log', 'a') as f:
            f.write('refork\n')
# 3. a thread group whose leader exits: /proc shows a zombie, the thread keeps writing
if os.fork() == 0:
    os.setsid()
    threading.Thread(target=writer, args=('thread',)).start()
    time.sleep(0.05)
    ctypes.CDLL(None).syscall(60, 0)  # SYS_exit (x86_64): ends only the calling thread
time.sleep(0.3)
print('started')
"""


async def test_row_21_nothing_outlives_its_step(host):
    episode_id = await ready(host)
    started = await host.step(episode_id=episode_id, action=py(ESCAPERS))
    assert "started" in started.observation, started
    first = await host.step(episode_id=episode_id, action=tool("fs.read", path="late.log"))
    listing = await processes(host, episode_id)
    second = await host.step(episode_id=episode_id, action=tool("fs.read", path="late.log"))
    # Between steps nothing writes: the log is the same, and the digest did not move.
    assert first.observation == second.observation
    assert first.diagnostics["workspace_digest"] == second.diagnostics["workspace_digest"]
    # Besides the shim, only the listing's own shell and tr: none of the escapers.
    assert "python3 -c" not in listing, listing


async def test_row_22_finalize_and_checkpoint_record_what_they_capture(tmp_path, docker_engine):
    caps = {"environment_checkpoint": True, "deterministic_prefix_reexecution": True}
    async with create_host_environment(run_root=tmp_path, image=SUPPORT_DESK, capabilities=caps) as host:
        episode_id = await ready(host)
        # Writers that keep changing the workspace after their step, if they survive it.
        started = await host.step(episode_id=episode_id, action=py(ESCAPERS))
        assert "started" in started.observation, started
        last = await host.step(episode_id=episode_id, action=tool("fs.read", path="late.log"))
        ckpt = await host.checkpoint(episode_id=episode_id)
        result = await host.finalize(episode_id=episode_id)
        assert ckpt.workspace_digest == result.workspace_digest == last.diagnostics["workspace_digest"]
        # The artifacts are exactly the world the digest describes.
        assert (result.workspace_path / "late.log").read_text() == last.observation
        await host.destroy(episode_id=episode_id)


async def test_row_23_unreadable_and_odd_entries_still_tell_worlds_apart(host):
    digests = []
    for n, content in enumerate(["one", "two"]):
        episode_id = await ready(host, f"ep-{n}")
        made = await host.step(
            episode_id=episode_id,
            action=shell(f"printf {content} > secret; chmod 000 secret; mkdir box; echo {content} > box/in; chmod 000 box"),
        )
        assert made.error is None, made
        denied = await host.step(episode_id=episode_id, action=tool("fs.read", path="secret"))
        assert denied.error.type == "permission_denied"  # file tools have the agent's rights
        digests.append(made.diagnostics["workspace_digest"])
        assert made.diagnostics.get("workspace_digest_complete", True)
    assert digests[0] != digests[1]
    # A FIFO and a socket at the same path with the same mode are different worlds too.
    kinds = []
    for n, make in enumerate(["mkfifo node", "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"node\")'"]):
        episode_id = await ready(host, f"kind-{n}")
        made = await host.step(episode_id=episode_id, action=shell(f"{make} && chmod 600 node"))
        assert made.error is None, made
        kinds.append(made.diagnostics["workspace_digest"])
    assert kinds[0] != kinds[1]


async def test_row_24_a_hard_link_from_outside_never_makes_the_digest_stale(tmp_path, docker_engine, episode_runtime):
    """With /tmp in the container's filesystem (tmp_size=None), HOME is the image user's folder
    on the workspace's filesystem, so the link can be made: multiply-linked files are re-read.
    (gVisor keeps /tmp in its own memory even then: there the link cannot be made at all.)"""
    async with create_host_environment(run_root=tmp_path, image=SUPPORT_DESK, container={"tmp_size": None}) as host:
        if episode_runtime == "runsc":
            episode_id = await ready(host)
            linked = await host.step(episode_id=episode_id, action=shell("echo one > $HOME/outside && ln $HOME/outside inside"))
            assert linked.error is not None and "cross-device" in linked.error.message, linked
            return
        await _hard_link_from_outside(host)


async def _hard_link_from_outside(host) -> None:  # type: ignore[no-untyped-def]
    episode_id = await ready(host)
    linked = await host.step(episode_id=episode_id, action=shell("echo one > $HOME/outside && ln $HOME/outside inside"))
    assert linked.error is None, linked
    changed = await host.step(episode_id=episode_id, action=shell("echo two > $HOME/outside"))
    assert changed.diagnostics["workspace_digest"] != linked.diagnostics["workspace_digest"]
    assert "inside" in changed.diagnostics["changed_paths"]
    read = await host.step(episode_id=episode_id, action=tool("fs.read", path="inside"))
    assert read.observation == "two\n"
    assert read.diagnostics["workspace_digest"] == changed.diagnostics["workspace_digest"]


async def test_row_27_non_utf8_names_come_back_as_readable_text(host):
    episode_id = await ready(host)
    made = await host.step(episode_id=episode_id, action=shell(r"""touch "$(printf 'bad\377name')" """))
    assert made.error is None, made
    assert made.diagnostics["changed_paths"] == ["bad\\xffname"]
    listing = await host.step(episode_id=episode_id, action=tool("fs.list"))
    assert {"name": "bad\\xffname", "type": "file", "size": 0} in listing.observation
    await host.step(episode_id=episode_id, action=shell("echo still alive"))


async def test_row_30_enormous_listings_are_capped(host):
    """25,000 files (creating 10^5 takes this machine's overlay filesystem 10-30 s); the caps are
    the defaults, 10,000 each."""
    episode_id = await ready(host)
    many = await host.step(
        episode_id=episode_id,
        action=py("import os\nos.mkdir('many')\nfor i in range(25000): open('many/f%06d' % i, 'w').close()", timeout_s=120),
    )
    assert many.error is None, many
    assert len(many.diagnostics["changed_paths"]) == 10_000
    assert many.diagnostics["changed_paths_truncated"] is True
    assert many.diagnostics["changed_paths_count"] == 25_001
    listing = await host.step(episode_id=episode_id, action=tool("fs.list", path="many"))
    assert len(listing.observation) == 10_000 and listing.observation[0]["name"] == "f000000"
    assert listing.diagnostics["entries"] == 25_000 and listing.diagnostics["truncated"] is True


def container_size_rw(episode_id: str) -> int:
    client = docker.from_env()
    try:
        labels = [f"{L.EPISODE}={episode_id}", f"{L.OWNER}={L.current_owner()}"]
        (summary,) = client.api.containers(all=True, size=True, filters={"label": labels})
        return int(summary.get("SizeRw") or 0)
    finally:
        client.close()


async def test_row_32_a_workspace_quota_stops_filling_the_disk(tmp_path, seed_root, docker_engine):
    quota = 64 * 1024 * 1024
    async with create_host_environment(
        run_root=tmp_path / "run", seed_root=seed_root, image=SUPPORT_DESK,
        container={"workspace_quota_bytes": quota, "workspace_quota_inodes": 2000},
    ) as host:
        episode_id = await ready(host)
        fill = await host.step(
            episode_id=episode_id, action=shell("for i in $(seq 1 40); do head -c 16M /dev/zero > big$i; done", timeout_s=60)
        )
        assert fill.error is not None and fill.error.type == "quota_exceeded", fill
        # Stopped within one poll interval of the quota: the host's disk holds about the quota.
        assert container_size_rw(episode_id) < quota + 48 * 1024 * 1024
        write = await host.step(episode_id=episode_id, action=tool("fs.write", path="more.txt", content="x" * 4096))
        assert write.error.type == "quota_exceeded"
        assert not any(e["name"] == "more.txt" for e in (await host.step(episode_id=episode_id, action=tool("fs.list"))).observation)
        # Over the quota, nothing that could write more runs (so bursts cannot pile up step after
        # step); deleting does.
        refused = await host.step(episode_id=episode_id, action=shell("touch marker; head -c 16M /dev/zero > more"))
        assert refused.error.type == "quota_exceeded" and "fs.delete" in refused.error.message
        listing = (await host.step(episode_id=episode_id, action=tool("fs.list"))).observation
        assert not any(e["name"] in ("marker", "more") for e in listing)  # the command never ran
        for entry in listing:
            if entry["name"].startswith("big"):
                assert (await host.step(episode_id=episode_id, action=tool("fs.delete", path=entry["name"]))).error is None
        inodes = await host.step(episode_id=episode_id, action=shell("mkdir n && cd n && touch $(seq 1 3000)"))
        assert inodes.error is not None and inodes.error.type == "quota_exceeded", inodes
        assert (await host.step(episode_id=episode_id, action=tool("fs.delete", path="n"))).error is None
        ok = await host.step(episode_id=episode_id, action=tool("fs.write", path="small.txt", content="fine"))
        assert ok.error is None


async def test_row_33_a_fifo_where_the_hook_reads_is_refused_at_once(tmp_path, seed_root, docker_engine):
    seen: list[str] = []

    async def on_step(ctx) -> dict:  # type: ignore[no-untyped-def]
        if await ctx.exists("report.txt"):
            try:
                seen.append(await ctx.read_text("report.txt"))
            except SandboxError as err:
                seen.append(f"refused: {err}")
        return {}

    async with create_host_environment(
        run_root=tmp_path / "run", seed_root=seed_root, image=SUPPORT_DESK, on_step=on_step, tool_timeout_s=20
    ) as host:
        episode_id = await ready(host)
        await host.step(episode_id=episode_id, action=shell("mkfifo report.txt"))
        assert len(seen) == 1 and "not_a_regular_file" in seen[0], seen
        after = await host.step(episode_id=episode_id, action=shell("rm report.txt; echo report > report.txt"))
        assert after.error is None and seen[-1] == "report\n"


EXHAUST_INOTIFY = (
    "import ctypes, time\n"
    "libc = ctypes.CDLL(None)\n"
    "report = open('/workspace/holding.tmp', 'w')  # opened first: the fd limit may be what stops the loop\n"
    "fds = []\n"
    "while True:\n"
    "    fd = libc.inotify_init1(0)\n"
    "    if fd < 0: break\n"
    "    fds.append(fd)\n"
    "report.write(str(len(fds)))\n"
    "report.close()\n"
    "import os; os.rename('/workspace/holding.tmp', '/workspace/holding')\n"
    "time.sleep(30)\n"
)


def read_in_container(episode_id: str, path: str) -> str | None:
    """A file's text through `docker exec` (beside the shim, which is busy with a step)."""
    result = container_of(episode_id).exec_run(["cat", path])
    return result.output.decode() if result.exit_code == 0 else None


def container_of(episode_id: str):  # type: ignore[no-untyped-def]
    client = docker.from_env()
    (container,) = client.containers.list(all=True, filters={"label": [f"{L.EPISODE}={episode_id}", f"{L.OWNER}={L.current_owner()}"]})
    return container


async def test_row_34_per_uid_kernel_limits_are_per_episode(host, episode_runtime):
    greedy, other = await ready(host, "greedy"), await ready(host, "other")
    greedy_uid = hello_of(host, greedy).uid
    assert greedy_uid != hello_of(host, other).uid and greedy_uid != os.getuid()
    hog = asyncio.create_task(host.step(episode_id=greedy, action=py(EXHAUST_INOTIFY, timeout_s=60)))
    try:
        # Wait (by observing, not by time) until the greedy episode holds every instance it can.
        while (held := await asyncio.to_thread(read_in_container, greedy, "/workspace/holding")) is None:
            assert not hog.done(), hog.result()
            await asyncio.sleep(0.05)
        if episode_runtime != "runsc":  # gVisor's kernel keeps no per-uid count: the fd limit stops it
            # The shim's own instance is charged to the episode's uid too (so are its watches:
            # an agent's folders never use up root's), hence one less.
            assert int(held) == int(Path("/proc/sys/fs/inotify/max_user_instances").read_text()) - 1
        neighbour = await host.step(
            episode_id=other, action=py("import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)")
        )
        assert neighbour.observation == "True\n", neighbour
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(0)
        assert fd >= 0  # the host's own user is unaffected
        os.close(fd)
    finally:
        await host.destroy(episode_id=greedy)
        await asyncio.gather(hog, return_exceptions=True)


async def test_row_39_exit_codes_that_mimic_limits_are_not_reported_as_limits(host):
    episode_id = await ready(host)
    fake_fsize = await host.step(episode_id=episode_id, action=shell("exit 153"))
    assert fake_fsize.error.type == "command_failed" and fake_fsize.diagnostics["exit_code"] == 153
    fake_oom = await host.step(episode_id=episode_id, action=shell("exit 137"))
    assert fake_oom.error.type == "command_failed" and fake_oom.diagnostics["exit_code"] == 137
    sigkill = await host.step(episode_id=episode_id, action=shell("kill -9 $$"))
    assert sigkill.error.type == "command_failed"
    # Up to the 1 GiB file-size limit: under gVisor on a loaded 2-core machine that took over a
    # minute once, so the time limit is generous (the point is which limit, not how fast).
    real = await host.step(episode_id=episode_id, action=shell("head -c 2G /dev/zero > huge", timeout_s=300))
    assert real.error.type == "file_too_large", real


async def test_row_21_a_folder_too_deep_to_walk_recursively_breaks_neither_tracking_nor_the_sweep(host):
    """1,500 nested folders: os.walk would recurse past Python's limit while the quota poll and
    the change tracker look at them."""
    episode_id = await ready(host)
    deep = await host.step(episode_id=episode_id, action=shell(
        "(sleep 300 &); mkdir -p $(python3 -c \"print('/'.join(['a'] * 1500))\") && echo made"
    ))
    assert deep.error is None and deep.observation == "made\n", deep
    assert len(deep.diagnostics["changed_paths"]) == 1500  # 2.3 MB of names: within a reply's budget
    listing = await processes(host, episode_id)
    assert "sleep 300" not in listing, listing


async def test_row_32_bursts_past_the_quota_do_not_pile_up_over_steps(tmp_path, seed_root, docker_engine):
    quota = 16 * 1024 * 1024
    async with create_host_environment(
        run_root=tmp_path / "run", seed_root=seed_root, image=SUPPORT_DESK, container={"workspace_quota_bytes": quota},
    ) as host:
        episode_id = await ready(host)
        burst = "python3 -c \"import os;f=open('f%d','wb');b=os.urandom(1<<20)\nfor _ in range(300): f.write(b)\""
        first = await host.step(episode_id=episode_id, action=shell(burst % 0, timeout_s=30))
        assert first.error is not None and first.error.type == "quota_exceeded", first
        after_one_burst = container_size_rw(episode_id)  # the quota plus what one look missed
        for i in range(1, 4):
            later = await host.step(episode_id=episode_id, action=shell(burst % i, timeout_s=30))
            assert later.error is not None and "only fs.delete" in later.error.message, later
        # The later steps were refused before anything ran: no second burst.
        assert container_size_rw(episode_id) < after_one_burst + 1024 * 1024


async def test_row_32_renaming_folders_does_not_blind_the_quota(tmp_path, seed_root, docker_engine):
    quota = 32 * 1024 * 1024
    async with create_host_environment(
        run_root=tmp_path / "run", seed_root=seed_root, image=SUPPORT_DESK, container={"workspace_quota_bytes": quota},
    ) as host:
        episode_id = await ready(host)
        dodge = await host.step(episode_id=episode_id, action=shell(
            "mkdir d1; (while true; do mv d1 d2; mv d2 d1; done) & "
            "for i in $(seq 1 30); do head -c 8M /dev/zero > big$i; done", timeout_s=60,
        ))
        assert dodge.error is not None and dodge.error.type == "quota_exceeded", dodge
        assert container_size_rw(episode_id) < quota + 48 * 1024 * 1024


async def test_row_32_a_rename_in_a_large_workspace_does_not_blind_the_quota_elsewhere(tmp_path, seed_root, docker_engine):
    """A renamed folder makes change tracking inexact, so the shim also walks the workspace,
    spaced by the walk's cost (large here). Writes outside the renamed folder are still reported
    by inotify and must stop the command at the next poll, not at the next walk."""
    quota = 64 * 1024 * 1024
    async with create_host_environment(
        run_root=tmp_path / "run", seed_root=seed_root, image=SUPPORT_DESK, container={"workspace_quota_bytes": quota},
        tool_timeout_s=120,
    ) as host:
        episode_id = await ready(host)
        many = "python3 -c \"import os\nfor d in range(100):\n os.mkdir('t%d'%d)\n for i in range(400): open('t%d/%d'%(d,i),'w').close()\""
        assert (await host.step(episode_id=episode_id, action=shell(many, timeout_s=120))).error is None
        burst = await host.step(episode_id=episode_id, action=shell(
            "mkdir dd && mv dd ee && for i in 1 2 3 4 5 6 7 8; do head -c 100M /dev/zero > big$i; done", timeout_s=60))
        assert burst.error is not None and burst.error.type == "quota_exceeded", burst
        assert container_size_rw(episode_id) < quota + 48 * 1024 * 1024


async def test_row_32_scratch_folders_outside_the_workspace_are_closed(host):
    episode_id = await ready(host)
    tried = await host.step(episode_id=episode_id, action=shell("touch /var/tmp/x 2>&1; echo $?"))
    assert tried.observation.strip().endswith("1"), tried


async def test_row_33_fs_write_to_a_fifo_is_refused_at_once(host):
    episode_id = await ready(host)
    await host.step(episode_id=episode_id, action=shell("mkfifo pipe"))
    write = await host.step(episode_id=episode_id, action=tool("fs.write", path="pipe", content="x"))
    assert write.error is not None and write.error.type == "not_a_regular_file", write
    await host.step(episode_id=episode_id, action=shell("echo still here"))


async def test_row_08_tools_have_no_new_privileges_even_when_the_container_allows_them(tmp_path, docker_engine):
    async with create_host_environment(
        run_root=tmp_path, image=SUPPORT_DESK, container={"no_new_privileges": False},
    ) as host:
        episode_id = await ready(host)
        status = await host.step(episode_id=episode_id, action=py("import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))"))
        assert status.observation == "1\n", status  # PR_GET_NO_NEW_PRIVS


async def test_rows_3_and_32_what_tools_write_outside_the_workspace_stays_off_the_hosts_disk(host):
    """HOME is on the bounded /tmp, and the scratch folders of the image are closed."""
    episode_id = await ready(host)
    wrote = await host.step(episode_id=episode_id, action=shell(
        "head -c 32M /dev/zero > $HOME/big; for d in /var/tmp /run/lock /var/lock; do touch $d/x 2>/dev/null && echo $d; done; echo done"
    ))
    assert wrote.observation == "done\n", wrote
    assert container_size_rw(episode_id) < 8 * 1024 * 1024


async def test_row_24_no_hard_link_to_a_workspace_file_can_be_made_outside_it(host):
    """The only folders of the agent's own on the workspace's filesystem are in the workspace:
    a link made elsewhere, written through and removed within one step, cannot exist."""
    episode_id = await ready(host)
    await host.step(episode_id=episode_id, action=tool("fs.write", path="a", content="one"))
    linked = await host.step(episode_id=episode_id, action=shell("ln a $HOME/x && echo two > $HOME/x && rm $HOME/x"))
    assert linked.error is not None and linked.error.type == "command_failed", linked
    assert (await host.step(episode_id=episode_id, action=tool("fs.read", path="a"))).observation == "one"


async def test_row_23_two_names_of_one_file_are_another_world_than_two_copies(host):
    digests = []
    for n, make in enumerate(["cp a b", "ln a b"]):
        episode_id = await ready(host, f"links-{n}")
        made = await host.step(episode_id=episode_id, action=shell(f"echo x > a && {make}"))
        digests.append(made.diagnostics["workspace_digest"])
    assert digests[0] != digests[1]


async def test_row_19_a_forked_child_owns_every_workspace_file_setuid_ones_too(tmp_path, docker_engine):
    caps = {"environment_checkpoint": True, "subject_state_import": True, "deterministic_prefix_reexecution": True}
    async with create_host_environment(run_root=tmp_path, image=SUPPORT_DESK, capabilities=caps, subject=Subject()) as host:
        parent = await ready(host, "parent")
        await host.step(episode_id=parent, action=shell("echo data > s && chmod 4755 s && mkdir d && echo x > d/f"))
        ckpt = await host.checkpoint(episode_id=parent)
        child = (await host.fork(episode_id=parent, path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)).episode_id
        foreign = await host.step(episode_id=child, action=shell("find . ! -user $(id -u); echo more >> s && echo appended"))
        assert foreign.observation == "appended\n", foreign


async def test_row_30_one_reply_stays_small_however_long_the_names(host):
    episode_id = await ready(host)
    many = await host.step(episode_id=episode_id, action=py(
        "import os\n"
        "for i in range(6000): open(b'%d-' % i + b'\\xfe' * 240, 'w').close()\n",
        timeout_s=60,
    ))
    assert many.error is None, many.observation
    size = len(many.model_dump_json())
    # 6,000 names of 960 escaped characters: under the 10,000 count cap, over the byte budget.
    assert size < 6 * 1024 * 1024 and many.diagnostics["changed_paths_count"] == 6000, size


async def test_row_35_a_workspace_deeper_than_any_host_path_is_cleaned_up(host):
    episode_id = await ready(host)
    await host.step(episode_id=episode_id, action=shell("mkdir -p $(python3 -c \"print('/'.join(['a'] * 1500))\")"))
    done = await host.finalize(episode_id=episode_id)
    await host.destroy(episode_id=episode_id, cleanup=True)
    assert not done.episode_dir.exists()
