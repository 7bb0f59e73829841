"""The warm pool on the engine: pooled containers (started without the seed, seeded through
the shim) give the same world as a cold reset and are all removed with the host. The pool,
admission and concurrency logic is tested on the local provider
(tests/unit/test_pool_and_concurrency.py)."""

from __future__ import annotations

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
