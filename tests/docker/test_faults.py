"""Faults that lose nothing (issue 29, items 16-18; SECURITY.md rows 15-17 extended).

"Nothing lost": every finished step is in ``trajectory.jsonl``, ``result.json`` exists for every
finalized or broken episode, no container or image of ours is left, and the next host (or the
next call of the same host) works. Each fault is made for real: a Docker engine of the test's
own is stopped and started (never the shared one, never the second engine other tests use), a
host process is SIGKILLed mid-step, and ``run_root`` sits on a small tmpfs the test fills.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import own_engine
import pytest
from helpers import BASE, fill_disk, owned_by_process, ready, this_process, tool

from softprobe.gym import (
    DockerUnavailableError,
    EpisodeBrokenError,
    EpisodeExistsError,
    GymError,
    RunRootWriteError,
    create_host_environment,
)
from softprobe.gym import labels as L
from softprobe.gym.results import EpisodeState, StepResult

pytestmark = pytest.mark.docker
TESTS = Path(__file__).parents[1]


def shell(command: str) -> dict[str, object]:
    return tool("shell.exec", command=command)


def trajectory(folder: Path) -> list[StepResult]:
    """The steps ``trajectory.jsonl`` holds, read strictly: every line whole (the file ends with
    a newline) and a StepResult."""
    data = (folder / "trajectory.jsonl").read_bytes()
    assert data == b"" or data.endswith(b"\n"), f"a half line ends the trajectory: {data[-80:]!r}"
    return [StepResult.model_validate_json(line) for line in data.split(b"\n")[:-1]]


def skip_unless(problem: str | None) -> None:
    """Skip with the reason printed; under CI, fail instead (CI runs as root)."""
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the fault tests, but {problem}", pytrace=False)
    print(f"\n[faults] skipped: {problem}")
    pytest.skip(problem)


async def running(client: docker.DockerClient, container_ids: list[str], command: str) -> None:
    """Until ``command`` runs in each container (a bounded poll of the engine's process list)."""
    deadline = time.monotonic() + 60
    for container_id in container_ids:
        while not any(command in " ".join(p) for p in client.api.top(container_id).get("Processes") or []):
            assert time.monotonic() < deadline, f"{command!r} never started in {container_id[:12]}"
            await asyncio.sleep(0.05)  # polling the engine's view, not synchronising our own code


# -- 29.16: the Docker engine restarts mid-rollout ----------------------------------------------


@pytest.fixture(scope="module")
def restartable_engine(docker_engine: None) -> Iterator[own_engine.OwnEngine]:
    """A dockerd of this module's own, holding the base image (shipped from the main engine
    through the library, as the Ray tests ship images to the second engine)."""
    skip_unless(own_engine.problem())
    engine = own_engine.OwnEngine()
    try:
        engine.start()
        engine.ship_image(BASE)
        yield engine
    finally:
        engine.remove()


async def test_29_16_an_engine_restart_breaks_the_steps_in_flight_at_once_and_reset_works_after(
    restartable_engine: own_engine.OwnEngine, tmp_path: Path, seed_root: Path
) -> None:
    engine = restartable_engine
    client = docker.DockerClient(base_url=engine.url)
    # A warm pool too: its idle containers die with the engine, and must never be handed out.
    host = create_host_environment(run_root=tmp_path / "run", image=BASE, docker_host=engine.url,
                                   tool_timeout_s=300, pool_size=2)
    try:
        episodes = ["in-flight-0", "in-flight-1", "idle"]
        for episode_id in episodes:
            await host.create_episode(episode_id=episode_id, seed_root=seed_root)
            await host.reset(episode_id=episode_id)
            done = await host.step(episode_id=episode_id, action=tool("fs.write", path="a.txt", content="1"))
            assert done.error is None
        await host.warm_up()
        steps = {e: asyncio.ensure_future(host.step(episode_id=e, action=shell("sleep 300"))) for e in episodes[:2]}
        containers = [host.runtime_of(episode_id=e).sandbox_id for e in episodes[:2]]
        await running(client, containers, "sleep 300")

        stopped = time.monotonic()
        stopping = asyncio.ensure_future(asyncio.to_thread(engine.stop))
        # Bounded: the steps end when the engine kills their containers, not when `sleep` would.
        outcomes = await asyncio.wait_for(asyncio.gather(*steps.values(), return_exceptions=True), 120)
        broken_s = time.monotonic() - stopped
        await stopping
        engine_s = time.monotonic() - stopped
        for episode_id, outcome in zip(steps, outcomes, strict=True):
            assert isinstance(outcome, EpisodeBrokenError), (episode_id, outcome)
            assert "Docker engine" in str(outcome) and "does not answer" in str(outcome), outcome

        # While it is down: the idle episode's container died too (typed, at once); a reset (of
        # an episode without seed files: a pooled container it would take needs no request) is a
        # typed error, not a hang and not a dead container.
        with pytest.raises(EpisodeBrokenError):
            await host.step(episode_id="idle", action=shell("echo alive"))
        await host.create_episode(episode_id="unseeded")
        with pytest.raises(DockerUnavailableError):
            await asyncio.wait_for(host.reset(episode_id="unseeded"), 120)

        await asyncio.to_thread(engine.start)
        # Back: the broken episodes' records are whole, and reset works again (the pool's other
        # dead container is set aside).
        for episode_id in episodes[:2]:
            final = await host.finalize(episode_id=episode_id)
            assert final.broken is not None and "Docker engine" in final.broken
            assert final.workspace_path is None and json.loads(final.result_path.read_text())["broken"] == final.broken
            assert [s.index for s in trajectory(final.episode_dir)] == [1]  # the finished step, not the one in flight
        for episode_id in ("idle", "unseeded"):
            await host.reset(episode_id=episode_id)
            echoed = await host.step(episode_id=episode_id, action=shell("echo back > b.txt && cat b.txt"))
            assert echoed.error is None and echoed.observation == "back\n"
            final = await host.finalize(episode_id=episode_id)
            assert final.broken is None and (final.workspace_path / "b.txt").read_text() == "back\n"
            assert [s.index for s in trajectory(final.episode_dir)] == [1]
        assert (host.run_root / "episodes" / "idle" / "workspace" / "hello.txt").is_file()  # seeded
        await host.close()
        label = {"label": f"{L.HOST}={host.host_id}"}
        assert client.api.containers(all=True, filters=label) == []
        assert client.api.images(filters=label) == []
        print(f"\n[faults] engine stopped in {engine_s:.1f} s; the steps in flight were broken after {broken_s:.1f} s")
    finally:
        await host.close()
        client.close()


# -- 29.17: the host process is SIGKILLed mid-step ----------------------------------------------


def start_host(run_root: Path, prefix: str) -> subprocess.Popen[str]:
    """killed_host.py, once it has a step in flight."""
    child = subprocess.Popen([sys.executable, str(TESTS / "killed_host.py"), str(run_root), BASE, prefix],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise AssertionError(f"the host process failed: {child.communicate()[1]}")
    return child


def in_flight_container(client: docker.DockerClient, pid: int, episode_id: str) -> list[str]:
    """The container of ``episode_id`` that the host process ``pid`` started."""
    prefix = f"{os.uname().nodename}:{pid}:"
    listed = client.api.containers(filters={"label": f"{L.EPISODE}={episode_id}"})
    return [c["Id"] for c in listed if c["Labels"].get(L.OWNER, "").startswith(prefix)]


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


async def test_29_17_a_host_killed_mid_step_leaves_whole_records_a_refusal_and_only_its_own_leftovers(
    tmp_path: Path, docker_engine: None
) -> None:
    run_root = tmp_path / "run"
    main = docker.from_env()
    live = create_host_environment(run_root=run_root, image=BASE)  # a live host of this test: kept
    killed = survivor = None
    try:
        await ready(live, "live-0")
        killed, survivor = start_host(run_root, "killed"), start_host(run_root, "survivor")
        for child, prefix in ((killed, "killed"), (survivor, "survivor")):
            await running(main, in_flight_container(main, child.pid, f"{prefix}-0"), "sleep 600")
        assert [len(found) for found in owned_by_process(killed.pid)] == [2, 1]  # two episodes, a checkpoint

        # SIGKILL mid-step, and not reaped (yet): its parent may not have waited for it.
        os.kill(killed.pid, signal.SIGKILL)
        os.waitid(os.P_PID, killed.pid, os.WEXITED | os.WNOWAIT)  # dead, still a zombie
        folder = run_root / "episodes" / "killed-0"
        before = folder_bytes(folder)
        assert [s.index for s in trajectory(folder)] == [1]  # the finished step; the one in flight is not there
        assert json.loads((folder / "episode.json").read_text())["owner"].split(":")[1] == str(killed.pid)

        # A new host on the same run_root refuses the dead host's folder and leaves it as it was.
        new = create_host_environment(run_root=run_root, image=BASE)
        try:
            with pytest.raises(EpisodeExistsError, match="already holds the records") as refused:
                await new.create_episode(episode_id="killed-0")
            assert "is no longer running" in str(refused.value) and "softprobe-gym gc" in str(refused.value)
            assert folder_bytes(folder) == before
            # Its first start sweeps exactly the dead host's containers and image.
            await ready(new, "new-0")
            assert owned_by_process(killed.pid) == ([], [])
            assert [len(found) for found in owned_by_process(survivor.pid)] == [2, 1]  # alive: kept
            for host, episode_id in ((live, "live-0"), (new, "new-0")):
                echoed = await host.step(episode_id=episode_id, action=shell("echo alive"))
                assert echoed.observation == "alive\n"

            # gc after the second host is killed: its leftovers go, the live hosts' stay.
            os.kill(survivor.pid, signal.SIGKILL)
            survivor.wait()
            done = subprocess.run([sys.executable, "-m", "softprobe.gym.cli", "gc", "--json"],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert owned_by_process(survivor.pid) == ([], [])
            for host, episode_id in ((live, "live-0"), (new, "new-0")):
                assert len(main.containers.list(filters=this_process(f"{L.EPISODE}={episode_id}"))) == 1
                echoed = await host.step(episode_id=episode_id, action=shell("echo still"))
                assert echoed.observation == "still\n"
        finally:
            await new.close()
    finally:
        await live.close()
        for child in (killed, survivor):
            if child is not None:
                child.kill()
                child.communicate()
        main.close()


# -- 29.18: run_root's disk is full -------------------------------------------------------------


class SmallDisk:
    """A tmpfs of ``size`` mounted at ``path`` (by this test, as root), to fill and free."""

    def __init__(self, path: Path, size: str = "8m") -> None:
        self.path = path
        self.filler = path / "filler"
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "softprobe-faults", str(path)],
                       check=True, capture_output=True, timeout=30)

    def fill(self) -> None:
        """Take every free byte (down to the last partial page of other files)."""
        fill_disk(self.path)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    skip_unless(None if os.geteuid() == 0 else "mounting a small tmpfs for run_root needs root")
    disk = SmallDisk(tmp_path / "disk")
    try:
        yield disk
    finally:
        disk.unmount()


@pytest.fixture
async def full_disk_host(small_disk: SmallDisk, seed_root: Path, docker_engine: None) -> AsyncIterator[object]:
    host = create_host_environment(run_root=small_disk.path / "run", seed_root=seed_root, image=BASE)
    try:
        yield host
    finally:
        small_disk.free()
        await host.close()
        main = docker.from_env()
        try:
            assert main.api.containers(all=True, filters={"label": f"{L.HOST}={host.host_id}"}) == []
        finally:
            main.close()


def no_half_files(folder: Path) -> None:
    """Every record in ``folder`` reads back whole; no temporary file is left."""
    assert [p.name for p in folder.iterdir() if ".tmp" in p.name] == []
    for name in ("episode.json", "result.json", "closure-report.json"):
        if (folder / name).exists():
            json.loads((folder / name).read_text())
    trajectory(folder)


async def test_29_18_a_full_disk_during_a_step_is_a_typed_error_and_the_trajectory_stays_whole(
    full_disk_host, small_disk: SmallDisk
) -> None:
    host = full_disk_host
    episode_id = await ready(host, "full-step")
    first = await host.step(episode_id=episode_id, action=shell("echo one"))
    folder = host.run_root / "episodes" / episode_id
    small_disk.fill()
    # A line larger than what is left in the trajectory's last page: a plain buffered write
    # leaves half of it in the file.
    with pytest.raises(RunRootWriteError, match="disk of run_root is full") as caught:
        await host.step(episode_id=episode_id, action=shell("python3 -c 'print(\"x\" * 6000)'"))
    error = caught.value
    assert isinstance(error, GymError) and error.errno == errno.ENOSPC and "free space" in str(error).lower()
    assert error.step_result is not None and error.step_result.index == 2
    assert error.step_result.observation == "x" * 6000 + "\n"  # the step ran; the caller has its result
    assert [s.model_dump_json() for s in trajectory(folder)] == [first.model_dump_json()]
    no_half_files(folder)
    with pytest.raises(EpisodeBrokenError, match="could not be recorded"):  # cleanly broken, not half recorded
        await host.step(episode_id=episode_id, action=shell("echo two"))
    with pytest.raises(RunRootWriteError):  # still full: finalize says so and writes nothing
        await host.finalize(episode_id=episode_id)
    no_half_files(folder)
    assert not (folder / "result.json").exists()

    small_disk.free()
    final = await host.finalize(episode_id=episode_id)
    assert final.broken is not None and "could not be recorded" in final.broken and final.steps == 1
    assert json.loads(final.result_path.read_text())["steps"] == len(trajectory(folder)) == 1
    no_half_files(folder)
    # The host keeps working.
    other = await ready(host, "after-full")
    assert (await host.step(episode_id=other, action=shell("echo ok"))).observation == "ok\n"
    assert [s.index for s in trajectory(host.run_root / "episodes" / other)] == [1]


async def test_29_18_a_full_disk_during_finalize_leaves_nothing_half_written_and_finalize_works_after(
    full_disk_host, small_disk: SmallDisk
) -> None:
    host = full_disk_host
    episode_id = await ready(host, "full-finalize")
    write = "python3 -c 'open(\"data.bin\", \"wb\").write(b\"y\" * 65536)'"
    assert (await host.step(episode_id=episode_id, action=shell(write))).error is None
    folder = host.run_root / "episodes" / episode_id
    small_disk.fill()
    with pytest.raises(RunRootWriteError, match="disk of run_root is full") as caught:
        await host.finalize(episode_id=episode_id)
    assert "finalize" in str(caught.value) and caught.value.errno == errno.ENOSPC
    assert host.state(episode_id=episode_id) is EpisodeState.RUNNING  # nothing was finalized
    assert not (folder / "result.json").exists() and not (folder / "workspace").exists()
    no_half_files(folder)
    # A new episode on a full disk: typed too, and its id is not taken by a half-made folder.
    with pytest.raises(RunRootWriteError):
        await host.create_episode(episode_id="made-on-a-full-disk")

    small_disk.free()
    final = await host.finalize(episode_id=episode_id)
    assert final.broken is None and (final.workspace_path / "data.bin").read_bytes() == b"y" * 65536
    no_half_files(folder)
    made = await ready(host, "made-on-a-full-disk")
    assert (await host.step(episode_id=made, action=shell("echo ok"))).observation == "ok\n"


def test_the_state_of_a_lost_container_waits_for_its_exit_to_be_on_record(client, docker_engine):
    """The engine records a container's exit (and an OOM kill) after its output has ended, so
    ``why_lost`` gives a container still running a moment to stop: otherwise a memory bomb under
    gVisor was sometimes reported as a closed stream only. The container's own ``sleep`` is the
    subject: the first read of its state comes while it runs."""
    from softprobe.gym.providers.docker.engine import DockerEngine

    labels = {L.MANAGED: "true", L.OWNER: L.current_owner()}
    exiting = client.containers.run(BASE, ["sh", "-c", "sleep 2; exit 7"], detach=True, labels=labels)
    lingering = client.containers.run(BASE, ["sleep", "600"], detach=True, labels=labels)
    engine = DockerEngine(docker_host=None, max_workers=1)
    try:
        state = engine.container_state(exiting.id, retry=False, exit_wait_s=60)
        assert (state["Running"], state["ExitCode"]) == (False, 7)
        state = engine.container_state(lingering.id, retry=False, exit_wait_s=1)
        assert state["Running"] is True  # it lives on: the wait is bounded and reports it running
    finally:
        engine.discard()
        for container in (exiting, lingering):
            container.remove(force=True)
