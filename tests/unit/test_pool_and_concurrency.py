"""The warm pool, many episodes at once, and the bound on sandboxes (on the local provider)."""

from __future__ import annotations

import asyncio
import os

from helpers import local_objects, tool

from softprobe.gym import create_host_environment


async def test_pooled_resets_are_fresh_seeded_and_never_reused(tmp_path, seed_root, local_provider):
    async with create_host_environment(run_root=tmp_path / "cold", seed_root=seed_root, provider=local_provider) as cold:
        await cold.create_episode(episode_id="c")
        cold_digest = (await cold.reset(episode_id="c")).diagnostics["workspace_digest"]
    host = create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider, pool_size=2)
    try:
        await host.warm_up()
        assert host.pool.ready == 2 and len(local_objects(local_provider, host)[0]) == 2
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
    assert local_objects(local_provider, host) == ([], [])  # pool sandboxes included


async def test_a_blocked_step_never_delays_another_episode(tmp_path, seed_root, local_provider):
    gate = tmp_path / "gate"  # outside every workspace; the local sandbox's commands reach it
    os.mkfifo(gate)
    async with create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider) as host:
        for name in ("blocked", "fast"):
            await host.create_episode(episode_id=name)
            await host.reset(episode_id=name)
        blocked = asyncio.create_task(
            host.step(episode_id="blocked", action=tool("shell.exec", command=f"read line < {gate}; echo got $line"))
        )
        for _ in range(20):
            result = await host.step(episode_id="fast", action=tool("fs.read", path="hello.txt"))
            assert result.error is None
        # The blocked step cannot finish before the gate opens, so the 20 steps ran beside it.
        assert not blocked.done()

        def open_gate() -> None:
            with open(gate, "w") as writer:  # waits for the reader, then lets it go
                writer.write("go\n")

        await asyncio.to_thread(open_gate)
        done = await blocked
        assert done.error is None and done.observation == "got go\n"


async def test_max_containers_bounds_episodes_holding_a_sandbox(tmp_path, local_provider):
    async with create_host_environment(run_root=tmp_path / "run", provider=local_provider, max_containers=2) as host:
        for name in ("a", "b", "c"):
            await host.create_episode(episode_id=name)
        await host.reset(episode_id="a")
        await host.reset(episode_id="b")
        third = asyncio.create_task(host.reset(episode_id="c"))
        await host.reset(episode_id="a")  # a reset keeps its slot: no deadlock
        # No slot was released, so the third reset is still waiting (however long a reset took).
        assert host.held_slots == 2 and not third.done()
        await host.settle()  # a's old sandbox is removed in the background
        assert len(local_objects(local_provider, host)[0]) == 2  # none started for c
        await host.finalize(episode_id="b")  # releases one
        await asyncio.wait_for(third, 60)
        await host.settle()
        assert len(local_objects(local_provider, host)[0]) == 2


async def test_many_episodes_step_concurrently(tmp_path, seed_root, local_provider):
    async with create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider) as host:
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


async def test_a_group_defers_only_its_own_refills(tmp_path, seed_root, local_provider, monkeypatch):
    """fork_many's children take pooled sandboxes without refills starting during the group (the
    pool refills when it ends); a take outside a group still refills at once, and a warm-up
    fills the pool, even while another group is under way: overlapping groups never keep the
    pool empty."""
    from softprobe.gym.episodes.pool import WarmPool

    host = create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider,
                                   pool_size=2)
    try:
        await host.create_episode(episode_id="p")
        await host.reset(episode_id="p")
        await host.step(episode_id="p", action=tool("fs.write", path="a.txt", content="a"))
        await host.warm_up()
        pool = host.pool
        assert pool is not None and pool.ready == 2
        filling_after_take: list[int] = []
        real_take = WarmPool.take

        def take(self: WarmPool):  # type: ignore[no-untyped-def]
            taken = real_take(self)
            filling_after_take.append(len(self._filling))
            return taken

        monkeypatch.setattr(WarmPool, "take", take)
        children = await host.fork_many(episode_id="p", n=2, path="prefix_reexecution", prefix_length=1)
        assert filling_after_take == [0, 0]  # the group took two, and nothing started meanwhile
        await pool.wait_ready()
        assert pool.ready == 2  # refilled after the group
        for child in children:
            await host.destroy(episode_id=child.episode_id)

        entered, release = asyncio.Event(), asyncio.Event()

        async def long_group() -> None:
            with pool.refill_after():
                entered.set()
                await release.wait()

        group = asyncio.ensure_future(long_group())
        await entered.wait()
        taken = pool.take()  # not the group's: replaced at once
        assert taken is not None and filling_after_take[-1] == 1
        await taken.remove()
        await pool.wait_ready()
        assert pool.ready == 2
        release.set()
        await group
    finally:
        await host.close()
    assert local_objects(local_provider, host) == ([], [])
