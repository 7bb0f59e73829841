"""Workspace checkpoints and group forks on the real engine: a 1 MB workspace archived through
the shim, changed, restored into warm pooled containers with an identical digest; blobs
deduplicated across checkpoints; no image committed; refused for a world with services; nothing
of this host left behind. The logic is tested on the local provider (tests/unit)."""

from __future__ import annotations

import os

import pytest
from helpers import ALL_CAPS, WORKSPACE_CAPS, NullSubject, host_objects, ready, tool

from softprobe.gym import ConfigurationError, create_host_environment

pytestmark = pytest.mark.docker

def blob_count(host, episode_id: str) -> int:  # type: ignore[no-untyped-def]
    return len(list((host.run_root / "episodes" / episode_id / "checkpoints" / "blobs").iterdir()))


async def test_a_1mb_workspace_round_trips_and_dedups(tmp_path, seed_root, docker_engine):
    for i in range(16):  # 16 files of 64 KiB: 1 MiB of seed
        (seed_root / f"data-{i:02d}.bin").write_bytes(os.urandom(64 * 1024))
    host = create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, capabilities=WORKSPACE_CAPS,
                                   subject=NullSubject(), pool_size=8)
    try:
        await host.warm_up()
        await ready(host, "parent")
        first = await host.checkpoint(episode_id="parent")
        assert first.scope == "workspace" and first.image_id is None
        assert first.bytes_added >= 1024 * 1024
        held = blob_count(host, "parent")
        await host.step(episode_id="parent", action=tool("fs.write", path="data-00.bin", content="changed"))
        await host.step(episode_id="parent", action=tool("shell.exec", command="mkdir -p new && echo hi > new/f"))
        second = await host.checkpoint(episode_id="parent")
        assert second.blobs_added == 2 and blob_count(host, "parent") == held + 2  # only the two new contents
        assert second.workspace_digest != first.workspace_digest

        child = await host.fork(episode_id="parent", path="checkpoint_import", checkpoint_id=first.checkpoint_id)
        assert child.lineage.workspace_digest == first.workspace_digest
        # The child's world is the first checkpoint's: the later changes are not in it.
        read = await host.step(episode_id=child.episode_id, action=tool("shell.exec", command="ls new; wc -c data-00.bin"))
        assert "No such file" in str(read.observation) and "65536" in str(read.observation)

        group = await host.fork_many(episode_id="parent", n=8, path="checkpoint_import",
                                     checkpoint_id=second.checkpoint_id)
        assert len(group) == 8 and {c.lineage.workspace_digest for c in group} == {second.workspace_digest}
        for c in group:  # each child's shim reports the checkpoint's digest, from a full rescan
            assert host.runtime_of(episode_id=c.episode_id).hello.workspace_digest == second.workspace_digest
        assert host_objects(host)[1] == set()  # no image was ever committed
    finally:
        await host.close()
    assert host_objects(host) == (set(), set())


async def test_prefix_group_of_8(tmp_path, seed_root, docker_engine):
    async with create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, capabilities=ALL_CAPS,
                                       subject=NullSubject(), pool_size=8) as host:
        await host.warm_up()
        await ready(host, "parent")
        await host.step(episode_id="parent", action=tool("shell.exec", command="echo one > a && echo two > b"))
        digest = host.trajectory(episode_id="parent")[-1].diagnostics["workspace_digest"]
        group = await host.fork_many(episode_id="parent", n=8, path="prefix_reexecution", prefix_length=1)
        assert {c.lineage.workspace_digest for c in group} == {digest}
    assert host_objects(host) == (set(), set())


def test_refused_for_a_world_with_services(tmp_path, docker_engine):
    with pytest.raises(ConfigurationError, match="checkpoint_scope='workspace'.*services"):
        create_host_environment(run_root=tmp_path / "run", capabilities=WORKSPACE_CAPS, subject=NullSubject(),
                                services=[{"name": "billing", "image": "softprobe/billing-service:latest"}],
                                network="services")
