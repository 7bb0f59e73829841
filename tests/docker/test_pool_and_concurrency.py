"""The warm pool, many episodes at once, and the bound on containers."""

from __future__ import annotations

import asyncio

import pytest

from helpers import SUPPORT_DESK, host_containers, tool
from softprobe.gym import create_host_environment

pytestmark = pytest.mark.docker


async def test_pooled_resets_are_fresh_seeded_and_never_reused(tmp_path, seed_root, docker_engine):
    async with create_host_environment(run_root=tmp_path / "cold", seed_root=seed_root, image=SUPPORT_DESK) as cold:
        await cold.create_episode(episode_id="c")
        cold_digest = (await cold.reset(episode_id="c")).diagnostics["workspace_digest"]
    host = create_host_environment(run_root=tmp_path, seed_root=seed_root, image=SUPPORT_DESK, pool_size=2)
    try:
        await host.warm_up()
        assert host.pool.ready == 2 and len(host_containers(host)) == 2
        used = set()
        for i in range(3):
            await host.create_episode(episode_id=f"e{i}")
            reset = await host.reset(episode_id=f"e{i}")
            assert reset.diagnostics["workspace_digest"] == cold_digest  # same world as a cold reset
            assert sorted(reset.observation["workspace_files"]) == ["docs/guide.md", "hello.txt"]
            listing = await host.step(episode_id=f"e{i}", action=tool("fs.list"))
            assert {e["name"] for e in listing.observation} == {"docs", "hello.txt"}  # nothing of e{i-1}
            await host.step(episode_id=f"e{i}", action=tool("fs.write", path=f"mark-{i}", content="x"))
            sandbox_id = host.runtime_of(episode_id=f"e{i}").sandbox_id
            assert sandbox_id not in used
            used.add(sandbox_id)
            await host.destroy(episode_id=f"e{i}")
            await host.pool.wait_ready()
            assert host.pool.ready == 2  # refilled
        assert host.pool.started == 2 + 3
    finally:
        await host.close()
    assert host_containers(host) == []  # pool containers included


async def test_a_slow_step_never_delays_another_episode(tmp_path, seed_root, docker_engine):
    async with create_host_environment(run_root=tmp_path, seed_root=seed_root, image=SUPPORT_DESK) as host:
        for name in ("slow", "fast"):
            await host.create_episode(episode_id=name)
            await host.reset(episode_id=name)
        slow = asyncio.create_task(host.step(episode_id="slow", action=tool("shell.exec", command="sleep 3")))
        for _ in range(20):
            result = await host.step(episode_id="fast", action=tool("fs.read", path="hello.txt"))
            assert result.error is None
        assert not slow.done(), "20 quick steps should finish while the other episode sleeps"
        assert (await slow).error is None


async def test_max_containers_bounds_episodes_holding_a_container(tmp_path, docker_engine):
    async with create_host_environment(run_root=tmp_path, image=SUPPORT_DESK, max_containers=2) as host:
        for name in ("a", "b", "c"):
            await host.create_episode(episode_id=name)
        await host.reset(episode_id="a")
        await host.reset(episode_id="b")
        third = asyncio.create_task(host.reset(episode_id="c"))
        await asyncio.sleep(0)
        assert host.held_slots == 2 and not third.done()
        assert len(host_containers(host)) == 2
        await host.reset(episode_id="a")  # a reset keeps its slot: no deadlock
        await host.finalize(episode_id="b")  # releases one
        await asyncio.wait_for(third, 60)
        assert len(host_containers(host)) == 2


async def test_many_episodes_step_concurrently(tmp_path, seed_root, docker_engine):
    async with create_host_environment(run_root=tmp_path, seed_root=seed_root, image=SUPPORT_DESK) as host:
        names = [f"p{i}" for i in range(8)]
        await asyncio.gather(*(host.create_episode(episode_id=n) for n in names))
        await asyncio.gather(*(host.reset(episode_id=n) for n in names))

        async def work(name: str) -> list:
            return [await host.step(episode_id=name, action=tool("fs.write", path="own.txt", content=name)) for _ in range(10)]

        results = await asyncio.gather(*(work(n) for n in names))
        assert all(r.error is None for steps in results for r in steps)
        for name in names:
            read = await host.step(episode_id=name, action=tool("fs.read", path="own.txt"))
            assert read.observation == name  # no episode saw another's workspace
