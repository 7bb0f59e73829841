"""SECURITY.md rows 25-38, the host's side of the trust boundary, on the real engine.

An agent controls every file name, link, mode and byte in its workspace and every value in its
actions. Whatever it does, the host's records stay readable and truthful, nothing lands outside
the episode's folder, other episodes are not held up, and a destroyed episode stays destroyed.
Crafted archives for rows 25, 26 and 31 are also in test_archive.py; pure validation of rows 28
and 29 in test_actions.py; terminal escaping (row 38) in test_text.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import stat
import statistics
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
from helpers import SUPPORT_DESK, ready, tool

from softprobe.gym import (
    CheckpointTooLargeError,
    EpisodeExistsError,
    EpisodeState,
    InvalidActionError,
    LifecycleError,
    create_host_environment,
)
from softprobe.gym import labels as L

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("episode_runtime")]  # row 40: runc and runsc


def shell(command: str, **extra: object) -> dict:
    return tool("shell.exec", command=command, **extra)


def py(code: str) -> dict:
    return shell(f"python3 -c {shlex.quote(code)}")


async def still_works(host, episode_id: str) -> None:  # type: ignore[no-untyped-def]
    result = await host.step(episode_id=episode_id, action=shell("echo alive"))
    assert result.observation == "alive\n" and result.error is None


def links_leading_out(root: Path) -> list[str]:
    real_root = os.path.realpath(root)
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            resolved = os.path.realpath(path)
            if os.path.islink(path) and resolved != real_root and not resolved.startswith(real_root + "/"):
                found.append(f"{path} -> {resolved}")
    return found


def saved_result(done) -> dict:  # type: ignore[no-untyped-def]
    """result.json as written: valid UTF-8 JSON (never an unserialisable name)."""
    return json.loads(done.result_path.read_bytes().decode("utf-8"))


async def test_row_25_a_link_chain_that_changes_meaning_later_never_leads_out(host):
    episode_id = await ready(host)
    # In archive order: b -> z/m/n (z not there yet), c -> b/../../../.. (looks like it stays in),
    # then z -> . makes b one level shorter, and c now climbs out of the episode's folder.
    await host.step(episode_id=episode_id, action=shell("mkdir -p m/n && ln -s z/m/n b && ln -s b/../../../.. c && ln -s . z"))
    done = await host.finalize(episode_id=episode_id)
    assert links_leading_out(done.workspace_path) == []
    assert [s.path for s in done.skipped_paths] == ["workspace/c"]
    assert "outside" in done.skipped_paths[0].reason
    assert os.readlink(done.workspace_path / "b") == "z/m/n"  # the links that stay inside are kept
    assert saved_result(done)["skipped_paths"][0]["path"] == "workspace/c"


async def test_row_26_paths_too_long_for_the_host_and_names_not_utf8_are_listed_and_result_is_written(host, episode_runtime):
    episode_id = await ready(host)
    # 16 folders of 250 bytes: legal in the container (under 4096 bytes), too long below run_root.
    created = await host.step(episode_id=episode_id, action=py(
        "import os\n"
        "deep = '/workspace/' + '/'.join(['d' * 250] * 16)\n"
        "os.makedirs(deep)\n"
        "open(deep + '/deep.txt', 'w').write('x')\n"
        "open(b'/workspace/bad-\\xff.txt', 'wb').write(b'x')\n"
        "os.mkfifo(b'/workspace/pipe-\\xfe')\n"
        "open('/workspace/ok.txt', 'w').write('ok')\n"
    ))
    assert created.error is None, created.observation
    done = await host.finalize(episode_id=episode_id)
    saved = saved_result(done)
    skipped = {s["path"]: s["reason"] for s in saved["skipped_paths"]}
    assert "workspace/bad-\\xff.txt" in skipped and "UTF-8" in skipped["workspace/bad-\\xff.txt"]
    if episode_runtime == "runsc":  # gVisor keeps FIFOs in its own kernel: never in the archive
        assert not any(path.startswith("workspace/pipe-") for path in skipped)
    else:
        assert "workspace/pipe-\\xfe" in skipped
    too_long = [path for path, reason in skipped.items() if "d" * 250 in path and "too long" in reason.lower()]
    assert too_long, skipped
    assert (done.workspace_path / "ok.txt").read_text() == "ok"
    assert host.state(episode_id=episode_id) is EpisodeState.FINALIZED


async def test_row_27_names_not_utf8_in_replies_are_readable_and_the_episode_is_not_broken(host):
    episode_id = await ready(host)
    made = await host.step(episode_id=episode_id, action=py("open(b'/workspace/bad-\\xff.txt', 'wb').write(b'x')"))
    assert made.diagnostics["changed_paths"] == ["bad-\\xff.txt"]
    listed = await host.step(episode_id=episode_id, action=tool("fs.list"))
    assert listed.error is None
    assert "bad-\\xff.txt" in [entry["name"] for entry in listed.observation]
    assert host.state(episode_id=episode_id) is EpisodeState.RUNNING
    lines = (host.run_root / "episodes" / episode_id / "trajectory.jsonl").read_bytes().decode("utf-8").splitlines()
    assert len(lines) == 2 and "bad-\\\\xff.txt" in lines[1]  # recorded as readable JSON text
    await still_works(host, episode_id)


async def test_row_28_non_finite_or_huge_numbers_are_refused_before_anything_runs(tmp_path, docker_engine):
    async with create_host_environment(run_root=tmp_path, image=SUPPORT_DESK, tool_timeout_s=2, max_tool_timeout_s=2) as host:
        episode_id = await ready(host)
        for bad in [10**400, float("nan"), float("inf"), float("-inf"), -(10**30)]:
            with pytest.raises(InvalidActionError, match="finite|64-bit"):
                await host.step(episode_id=episode_id, action=shell("touch ran", timeout_s=bad))
        with pytest.raises(InvalidActionError, match="finite"):
            await host.step(episode_id=episode_id, action=tool("fs.write", path="x", content="x", meta={"n": [float("nan")]}))
        assert host.trajectory(episode_id=episode_id) == []  # nothing ran, nothing recorded
        # A huge but finite timeout is held to max_tool_timeout_s: the sleep is cut at 2 s.
        bounded = await host.step(episode_id=episode_id, action=shell("sleep 60", timeout_s=10**18))
        assert bounded.error is not None and bounded.error.type == "timeout"
        ran = await host.step(episode_id=episode_id, action=shell("test -e ran || echo none"))
        assert ran.observation.strip() == "none"
        await still_works(host, episode_id)


LONE = "\ud800"


@pytest.mark.parametrize(
    "action",
    [
        tool("fs.write", **{f"pa{LONE}th": "x"}),
        tool("fs.write", path="x", content="ok", meta={f"k{LONE}": 1}),
        tool("fs.write", path="x", content=["fine", f"bad{LONE}"]),
        tool(f"fs.read{LONE}", path="x"),
        {"type": "terminate", "output": f"done{LONE}"},
    ],
    ids=["arg-key", "nested-key", "nested-value", "tool-name", "terminate-output"],
)
async def test_row_29_lone_surrogates_anywhere_in_an_action_are_refused(host, action):
    episode_id = await ready(host)
    with pytest.raises(InvalidActionError, match="(?i)unicode"):
        await host.step(episode_id=episode_id, action=action)
    assert host.trajectory(episode_id=episode_id) == []
    await still_works(host, episode_id)


def test_row_29_through_the_gymnasium_adapter(tmp_path, docker_engine, seed_root):
    from helpers import require_extra

    gymnasium_env = require_extra("softprobe.gym.training.gymnasium", "gymnasium")
    env = gymnasium_env.SoftprobeEnv(image=SUPPORT_DESK, seed_root=seed_root, run_root=tmp_path)
    try:
        env.reset()
        for action in [
            tool("fs.read", **{f"pa{LONE}th": "hello.txt"}),
            '{"type": "tool", "name": "fs.read", "args": {"\\ud800": "hello.txt"}}',
            '{"type": "tool", "name": "shell.exec", "args": {"command": "true", "timeout_s": NaN}}',
            '{"type": "tool", "name": "shell.exec", "args": {"command": "true", "timeout_s": 1e400}}',
        ]:
            observation, reward, terminated, truncated, info = env.step(action)
            assert info["error"]["type"] == "invalid_action", observation
            assert (reward, terminated, truncated) == (0.0, False, False)
            observation.encode("ascii")  # the space's charset: still printable ASCII
        observation, *_ = env.step(tool("fs.read", path="hello.txt"))
        assert "hello from the seed" in observation
    finally:
        env.close()


def disk_bytes(root: Path) -> int:
    return sum(os.lstat(os.path.join(d, n)).st_blocks * 512 for d, dirs, files in os.walk(root) for n in dirs + files)


async def test_row_31_sparse_files_stay_sparse_on_the_host(host):
    episode_id = await ready(host)
    await host.step(episode_id=episode_id, action=shell("truncate -s 200m sparse.img && printf end >> sparse.img"))
    done = await host.finalize(episode_id=episode_id)
    copied = done.workspace_path / "sparse.img"
    assert copied.stat().st_size == 200 * 1024 * 1024 + 3
    assert copied.stat().st_blocks * 512 <= 1024 * 1024, "the holes were written out as zeros"
    with open(copied, "rb") as f:
        f.seek(-3, os.SEEK_END)
        assert f.read() == b"end"
    assert done.skipped_paths == []


async def test_row_31_finalize_stops_at_the_artifact_byte_budget(tmp_path, docker_engine):
    budget = 32 * 1024 * 1024
    async with create_host_environment(run_root=tmp_path, image=SUPPORT_DESK, artifact_budget_bytes=budget) as host:
        episode_id = await ready(host)
        await host.step(episode_id=episode_id, action=shell("echo a > a.txt && truncate -s 900m b.img && echo c > c.txt"))
        done = await host.finalize(episode_id=episode_id)
        saved = saved_result(done)
        assert (done.workspace_path / "a.txt").read_text() == "a\n"
        assert not (done.workspace_path / "b.img").exists() and not (done.workspace_path / "c.txt").exists()
        assert [s["path"] for s in saved["skipped_paths"]] == ["workspace/b.img"]
        assert str(budget) in saved["skipped_paths"][0]["reason"]
        assert disk_bytes(done.workspace_path) <= budget


async def test_row_31_checkpoint_refuses_changes_over_its_byte_budget(tmp_path, docker_engine):
    budget = 64 * 1024 * 1024
    async with create_host_environment(run_root=tmp_path, image=SUPPORT_DESK, checkpoint_budget_bytes=budget) as host:
        episode_id = await ready(host)
        await host.step(episode_id=episode_id, action=shell("truncate -s 200m sparse.img"))  # no data, 200 MiB long
        with pytest.raises(CheckpointTooLargeError, match="checkpoint budget") as caught:
            await host.checkpoint(episode_id=episode_id)
        assert caught.value.size_bytes > budget and caught.value.budget_bytes == budget
        client = docker.from_env()
        try:
            committed = client.images.list(filters={"label": [f"{L.EPISODE}={episode_id}", f"{L.HOST}={host.host_id}"]})
        finally:
            client.close()
        assert committed == []  # refused before anything was committed
        await host.step(episode_id=episode_id, action=shell("rm sparse.img"))
        record = await host.checkpoint(episode_id=episode_id)  # within the budget again
        assert record.image_id.startswith("sha256:")
        await still_works(host, episode_id)


async def test_finalize_keeps_the_permission_bits_the_container_had(host):
    episode_id = await ready(host)
    await host.step(episode_id=episode_id, action=shell(
        "mkdir private shared && chmod 700 private && chmod 775 shared && echo s > private/secret && "
        "chmod 600 private/secret && echo r > run.sh && chmod 4751 run.sh && echo n > none && chmod 000 none"
    ))
    done = await host.finalize(episode_id=episode_id)
    modes = {name: stat.S_IMODE(os.lstat(done.workspace_path / name).st_mode)
             for name in ["private", "shared", "private/secret", "run.sh", "none"]}
    # As in the container (and so as the workspace digest counted them), minus setuid/setgid/sticky.
    assert modes == {"private": 0o700, "shared": 0o775, "private/secret": 0o600, "run.sh": 0o751, "none": 0o000}


async def test_row_35_a_huge_cleanup_does_not_hold_up_other_episodes(host):
    neighbour = await ready(host, "neighbour")
    big = await host.create_episode(episode_id="big")
    # 60,000 files in the episode's folder, as a finalize of a busy workspace leaves them.
    for group in range(60):
        folder = big.episode_dir / "workspace" / f"d{group}"
        folder.mkdir(parents=True)
        for i in range(1000):
            os.close(os.open(folder / f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    read = tool("fs.read", path="hello.txt")

    async def timed_step() -> float:
        started = time.perf_counter()
        result = await host.step(episode_id=neighbour, action=read)
        assert result.error is None
        return time.perf_counter() - started

    baseline = [await timed_step() for _ in range(20)]
    started = time.perf_counter()
    cleanup = asyncio.ensure_future(host.destroy(episode_id="big", cleanup=True))
    during = []
    while not cleanup.done():
        during.append(await timed_step())
    await cleanup
    cleanup_s = time.perf_counter() - started
    assert not big.episode_dir.exists()
    worst = max(during)
    print(f"\n[row 35] cleanup {cleanup_s * 1000:.0f} ms; neighbour step p50 before "
          f"{statistics.median(baseline) * 1000:.1f} ms, during p50 {statistics.median(during) * 1000:.1f} ms, "
          f"worst {worst * 1000:.1f} ms over {len(during)} steps ({worst / statistics.median(baseline):.1f}x p50 before)")
    # On the event loop, the step in flight would wait for the whole deletion (ratio about 1).
    assert worst < 0.5 * cleanup_s, f"a neighbour's step took {worst:.3f}s of a {cleanup_s:.3f}s cleanup"


@pytest.mark.parametrize("cleanup", [False, True], ids=["keep-folder", "cleanup"])
async def test_row_36_destroy_during_the_on_step_hook_stays_destroyed(tmp_path, seed_root, docker_engine, cleanup):
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_hook(ctx):  # type: ignore[no-untyped-def]
        entered.set()
        await release.wait()
        return {"hooked": True}

    async with create_host_environment(run_root=tmp_path, seed_root=seed_root, image=SUPPORT_DESK, on_step=slow_hook) as host:
        episode_id = await ready(host)
        step = asyncio.ensure_future(host.step(episode_id=episode_id, action=shell("echo hi")))
        await entered.wait()
        await host.destroy(episode_id=episode_id)
        assert host.state(episode_id=episode_id) is EpisodeState.DESTROYED
        # The folder is deleted only once the step in flight has let go of the episode.
        destroying = asyncio.ensure_future(host.destroy(episode_id=episode_id, cleanup=cleanup))
        release.set()
        with pytest.raises(LifecycleError, match="destroyed"):
            await step
        await destroying
        assert host.state(episode_id=episode_id) is EpisodeState.DESTROYED
        folder = tmp_path / "episodes" / episode_id
        if cleanup:
            assert not folder.exists()
        else:
            assert json.loads((folder / "episode.json").read_text())["state"] == "destroyed"
            assert (folder / "trajectory.jsonl").read_text() == ""  # the step was not recorded
        with pytest.raises(LifecycleError):
            await host.step(episode_id=episode_id, action=shell("echo again"))


async def test_row_36_destroy_during_finalize_stays_destroyed(host):
    episode_id = await ready(host)
    await host.step(episode_id=episode_id, action=shell("echo x > x.txt"))
    sandbox = host.runtime_of(episode_id=episode_id)  # gate its real copy, to destroy mid-finalize
    entered, release = asyncio.Event(), asyncio.Event()
    real_copy_out = sandbox.copy_out_workspace

    async def gated_copy_out(*args, **kwargs):  # type: ignore[no-untyped-def]
        entered.set()
        await release.wait()
        return await real_copy_out(*args, **kwargs)

    sandbox.copy_out_workspace = gated_copy_out
    finalize = asyncio.ensure_future(host.finalize(episode_id=episode_id))
    await entered.wait()
    await host.destroy(episode_id=episode_id)
    release.set()
    with pytest.raises(LifecycleError, match="destroyed"):
        await finalize
    assert host.state(episode_id=episode_id) is EpisodeState.DESTROYED
    assert not (host.run_root / "episodes" / episode_id / "result.json").exists()


async def test_row_36_destroy_while_finalize_stops_the_container_stays_destroyed(host):
    episode_id = await ready(host)
    sandbox = host.runtime_of(episode_id=episode_id)  # gate its real removal, the last await of finalize
    entered, release = asyncio.Event(), asyncio.Event()
    real_remove = sandbox.remove

    async def gated_remove():  # type: ignore[no-untyped-def]
        entered.set()
        await release.wait()
        await real_remove()

    sandbox.remove = gated_remove
    finalize = asyncio.ensure_future(host.finalize(episode_id=episode_id))
    await entered.wait()
    await host.destroy(episode_id=episode_id)
    release.set()
    done = await finalize  # its records were already written: it completes
    assert done.result_path.exists()
    assert host.state(episode_id=episode_id) is EpisodeState.DESTROYED
    assert json.loads((done.episode_dir / "episode.json").read_text())["state"] == "destroyed"


async def test_row_36_destroy_during_checkpoint_stays_destroyed_and_leaves_no_image(host):
    episode_id = await ready(host)
    sandbox = host.runtime_of(episode_id=episode_id)  # gate its real commit, to destroy mid-checkpoint
    entered, release = asyncio.Event(), asyncio.Event()
    real_commit = sandbox.commit

    async def gated_commit(*args, **kwargs):  # type: ignore[no-untyped-def]
        entered.set()
        await release.wait()
        return await real_commit(*args, **kwargs)

    sandbox.commit = gated_commit
    checkpoint = asyncio.ensure_future(host.checkpoint(episode_id=episode_id))
    await entered.wait()
    await host.destroy(episode_id=episode_id)
    release.set()
    with pytest.raises(LifecycleError, match="destroyed"):
        await checkpoint
    assert host.state(episode_id=episode_id) is EpisodeState.DESTROYED
    client = docker.from_env()
    try:
        assert client.images.list(filters={"label": f"{L.HOST}={host.host_id}"}) == []
    finally:
        client.close()


async def test_row_37_a_second_host_on_the_same_run_root_cannot_take_an_episode_id(host):
    episode_id = await ready(host, "shared-id")
    await host.step(episode_id=episode_id, action=shell("echo one"))
    folder = host.run_root / "episodes" / episode_id
    before = {name: (folder / name).read_bytes() for name in ["episode.json", "trajectory.jsonl"]}
    async with create_host_environment(run_root=host.run_root, image=SUPPORT_DESK, sweep_on_start=False) as second:
        with pytest.raises(EpisodeExistsError, match="already holds the records"):
            await second.create_episode(episode_id=episode_id)
        assert {name: (folder / name).read_bytes() for name in before} == before
    await host.step(episode_id=episode_id, action=shell("echo two"))  # the owner goes on
    assert len((folder / "trajectory.jsonl").read_text().splitlines()) == 2


async def test_row_38_agent_text_cannot_redraw_a_fail_row_of_grade(tmp_path, docker_engine):
    run_root = tmp_path / "run"
    forged = "nope\r\x1b[2Kforged          pass    1.000  native   Assertion passed\x1b[8m"
    async with create_host_environment(run_root=run_root, image=SUPPORT_DESK) as host:
        episode_id = await ready(host, "attacker")
        await host.step(episode_id=episode_id, action={"type": "terminate", "output": forged})
        await host.finalize(episode_id=episode_id)
    spec = tmp_path / "assert.yaml"
    spec.write_text("- type: equals\n  value: expected answer\n")
    done = subprocess.run(
        [sys.executable, "-m", "softprobe.gym.cli", "grade", str(run_root), "--assert", str(spec), "--backend", "native"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert "\r" not in done.stdout and "\x1b" not in done.stdout
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("attacker")]
    assert " FAIL " in row and "\\r\\x1b[2Kforged" in row
