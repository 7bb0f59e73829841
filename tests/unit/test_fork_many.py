"""Group forks: ``fork_many`` makes n children from one branch point at once, on either legal
path; every refusal comes before any child exists, and a partial failure leaves none (on the
local provider)."""

from __future__ import annotations

import pytest
from helpers import local_objects, ready, tool

from softprobe.gym import ForkRequestError, Host, UnsupportedForkError, create_host_environment
from softprobe.gym.errors import ForkManyError

CAPS = {"environment_checkpoint": True, "subject_state_import": True, "deterministic_prefix_reexecution": True}


class Subject:
    def __init__(self, fail_for: set[str] | None = None) -> None:
        self.fail_for = fail_for or set()
        self.imported: list[str] = []

    def export_state(self, episode_id: str) -> dict:
        return {"from": episode_id}

    def import_state(self, episode_id: str, state: dict) -> None:
        if episode_id in self.fail_for:
            raise RuntimeError("this child's subject cannot load")
        self.imported.append(episode_id)


def children_folders(host) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(p.name for p in (host.run_root / "episodes").iterdir() if p.name != "ep-1")


async def test_prefix_reexecution_group_shares_the_branch_point(tmp_path, seed_root, local_provider):
    async with create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider,
                                       capabilities=CAPS, subject=Subject(), pool_size=4) as host:
        assert isinstance(host, Host)
        await ready(host)
        await host.step(episode_id="ep-1", action=tool("fs.write", path="a.txt", content="one"))
        await host.step(episode_id="ep-1", action=tool("fs.write", path="b.txt", content="two"))
        parent_digest = host.trajectory(episode_id="ep-1")[-1].diagnostics["workspace_digest"]
        children = await host.fork_many(episode_id="ep-1", n=4, path="prefix_reexecution", prefix_length=2)
        assert len({c.episode_id for c in children}) == 4
        assert {c.lineage.workspace_digest for c in children} == {parent_digest}
        assert all(c.lineage.branch_step == 2 and c.lineage.parent_episode_id == "ep-1" for c in children)
        # Each child is its own world from there on.
        await host.step(episode_id=children[0].episode_id, action=tool("fs.write", path="a.txt", content="changed"))
        other = await host.step(episode_id=children[1].episode_id, action=tool("fs.read", path="a.txt"))
        assert "one" in str(other.observation)
    assert local_objects(local_provider, host) == ([], [])


@pytest.mark.parametrize("scope", ["container", "workspace"])
async def test_checkpoint_group_with_given_ids(tmp_path, seed_root, local_provider, scope):
    subject = Subject()
    async with create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider,
                                       capabilities={**CAPS, "checkpoint_scope": scope}, subject=subject) as host:
        await ready(host)
        await host.step(episode_id="ep-1", action=tool("fs.write", path="a.txt", content="one"))
        record = await host.checkpoint(episode_id="ep-1")
        ids = [f"kid-{i}" for i in range(3)]
        children = await host.fork_many(episode_id="ep-1", n=3, path="checkpoint_import",
                                        checkpoint_id=record.checkpoint_id, child_episode_ids=ids)
        assert [c.episode_id for c in children] == ids
        assert {c.lineage.workspace_digest for c in children} == {record.workspace_digest}
        assert sorted(subject.imported) == ids
    assert local_objects(local_provider, host) == ([], [])


async def test_a_partial_failure_leaves_no_child(tmp_path, seed_root, local_provider):
    subject = Subject(fail_for={"kid-1"})
    async with create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider,
                                       capabilities={**CAPS, "checkpoint_scope": "workspace"}, subject=subject) as host:
        await ready(host)
        record = await host.checkpoint(episode_id="ep-1")
        with pytest.raises(ForkManyError, match="1 of 3 children failed.*child 1: SubjectStateError") as caught:
            await host.fork_many(episode_id="ep-1", n=3, path="checkpoint_import", checkpoint_id=record.checkpoint_id,
                                 child_episode_ids=["kid-0", "kid-1", "kid-2"])
        assert list(caught.value.failures) == [1] and caught.value.cancelled == 2
        assert children_folders(host) == []
        assert len(local_objects(local_provider, host)[0]) == 1  # only the parent's sandbox
        # The ids are free again.
        subject.fail_for.clear()
        again = await host.fork_many(episode_id="ep-1", n=3, path="checkpoint_import",
                                     checkpoint_id=record.checkpoint_id, child_episode_ids=["kid-0", "kid-1", "kid-2"])
        assert len(again) == 3
    assert local_objects(local_provider, host) == ([], [])


async def test_refusals_come_before_any_child(tmp_path, seed_root, local_provider):
    async with create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider,
                                       capabilities=CAPS, subject=Subject(), max_containers=3) as host:
        await ready(host)
        for bad in (0, -1, True, "2"):
            with pytest.raises(ForkRequestError, match="positive int"):
                await host.fork_many(episode_id="ep-1", n=bad, path="prefix_reexecution", prefix_length=0)
        with pytest.raises(ForkRequestError, match="distinct"):
            await host.fork_many(episode_id="ep-1", n=2, path="prefix_reexecution", prefix_length=0,
                                 child_episode_ids=["x", "x"])
        with pytest.raises(ForkRequestError, match="out of range"):
            await host.fork_many(episode_id="ep-1", n=2, path="prefix_reexecution", prefix_length=5)
        with pytest.raises(UnsupportedForkError):
            await host.fork_many(episode_id="ep-1", n=2, path="restore_and_replay")
        with pytest.raises(ForkRequestError, match="max_containers=3"):
            await host.fork_many(episode_id="ep-1", n=3, path="prefix_reexecution", prefix_length=0)
        assert children_folders(host) == []
        assert len(await host.fork_many(episode_id="ep-1", n=2, path="prefix_reexecution", prefix_length=0)) == 2
    assert local_objects(local_provider, host) == ([], [])
