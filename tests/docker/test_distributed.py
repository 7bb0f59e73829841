"""Episodes across a local multi-node Ray cluster.

All nodes of ``ray.cluster_utils.Cluster`` run on this machine and share its one Docker engine:
the tests prove placement, routing, image shipping through the object store and the failure of
one node's episodes, not that two engines work (they would: each actor only talks to its own).
"""

from __future__ import annotations

import asyncio
import io
import time

import docker
import pytest
from helpers import require_extra  # noqa: E402

ray = require_extra("ray", "ray")
Cluster = require_extra("ray.cluster_utils", "ray").Cluster

from helpers import SUPPORT_DESK, owned_by_process, tool  # noqa: E402

from softprobe.gym import create_host_environment, create_training_session  # noqa: E402
from softprobe.gym.scale.ray import DistributedHost, NodeLostError, RolloutFailedError, RolloutOutcome  # noqa: E402

pytestmark = pytest.mark.docker

# Functions of this module (reward_from) travel to the Ray workers by value: they cannot import it.
ray.cloudpickle.register_pickle_by_value(__import__("sys").modules[__name__])


@pytest.fixture(scope="module")
def cluster(docker_engine):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=1, resources={"docker": 1}) for _ in range(2)]
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    yield cluster, nodes
    ray.shutdown()
    cluster.shutdown()


def story(account: str) -> list[dict]:
    return [tool("crm.get_account", id=account), tool("fs.write", path="note.md", content=f"note for {account}"),
            {"type": "terminate"}]


def facts(ctx):
    return {"checks": [{"name": "ok", "passed": ctx.step_result.error is None}]}


async def test_one_host_actor_per_docker_node_and_routing(cluster, tmp_path):
    dist = await DistributedHost.connect(run_root=str(tmp_path), image=SUPPORT_DESK)
    try:
        assert len(dist.nodes) == 2
        handles = [await dist.create_episode(episode_id=f"route-{i}") for i in range(4)]
        assert {dist.node_of(h.episode_id) for h in handles} == set(dist.nodes)  # least-loaded placement
        for h in handles:
            await dist.reset(episode_id=h.episode_id)
            step = await dist.step(episode_id=h.episode_id, action=tool("crm.get_account", id="A-42"))
            assert step.observation["id"] == "A-42"
        child = await dist.fork(episode_id="route-0", path="prefix_reexecution", prefix_length=1)
        assert dist.node_of(child.episode_id) == dist.node_of("route-0")
        done = await dist.finalize(episode_id="route-1")
        assert done.steps == 1
    finally:
        await dist.close()


async def test_a_batch_across_nodes_matches_a_local_run(cluster, tmp_path):
    accounts = ["A-42", "A-7", "A-99", "A-42", "A-7", "A-99", "A-42", "A-7"]
    specs = [{"episode_id": f"batch-{i}", "actions": story(a), "reward_from": facts} for i, a in enumerate(accounts)]
    started = time.perf_counter()
    dist = await DistributedHost.connect(run_root=str(tmp_path / "dist"), image=SUPPORT_DESK)
    try:
        remote = [outcome.unwrap() for outcome in await dist.run_rollouts(specs, concurrency=8)]
        remote_s = time.perf_counter() - started
        assert len(set(dist.placements[s["episode_id"]] for s in specs)) == 2
    finally:
        await dist.close()
    started = time.perf_counter()
    local = []
    async with create_host_environment(run_root=tmp_path / "local", image=SUPPORT_DESK) as host:
        for spec in specs:
            session = create_training_session(host, episode_id=spec["episode_id"], reward_from=facts)
            async for _ in session.rollout(spec["actions"]):
                pass
            local.append(await session.finalize())
    local_s = time.perf_counter() - started
    assert [r.trajectory_digest for r in remote] == [r.trajectory_digest for r in local]
    assert [r.total_reward for r in remote] == [r.total_reward for r in local] == [3.0] * 8
    print(f"\n[ray] 8 rollouts: local {local_s:.2f} s, two-node cluster {remote_s:.2f} s (incl. connect)")


async def test_run_rollouts_returns_a_typed_outcome_naming_each_rollout_and_node(cluster, tmp_path):
    specs = [{"episode_id": "fine", "actions": story("A-42")},
             {"episode_id": "bad-action", "actions": [{"type": "teleport"}]}]
    dist = await DistributedHost.connect(run_root=str(tmp_path), image=SUPPORT_DESK)
    try:
        fine, bad = await dist.run_rollouts(specs, concurrency=2)
    finally:
        await dist.close()
    assert isinstance(fine, RolloutOutcome) and fine.ok and fine.error is None
    assert fine.unwrap().episode_id == "fine" and fine.node_id == dist.placements["fine"]
    assert not bad.ok and bad.result is None and isinstance(bad.error, RolloutFailedError)
    assert bad.error.episode_id == "bad-action" and bad.error.node_id == bad.node_id == dist.placements["bad-action"]
    assert str(bad.error).startswith(f"rollout 'bad-action' failed on node {bad.node_id[:12]}: InvalidActionError")
    with pytest.raises(RolloutFailedError):
        bad.unwrap()


async def test_a_node_without_the_image_gets_it_shipped(cluster, tmp_path):
    client = docker.from_env()
    dockerfile = io.BytesIO(b"FROM softprobe/base:latest\nLABEL softprobe.gym.test=shipped\n")
    image, _ = client.images.build(fileobj=dockerfile, tag="softprobe-test/shipped:1", rm=True)
    dist = await DistributedHost.connect(run_root=str(tmp_path), image="softprobe-test/shipped:1")
    try:
        dist._blobs["softprobe-test/shipped:1"] = b"".join(image.save(named=True))  # the driver keeps a copy...
        client.images.remove(image.id, force=True)  # ...and the (shared) engine loses it
        handle = await dist.create_episode(episode_id="shipped")
        await dist.reset(episode_id="shipped")
        assert client.images.get("softprobe-test/shipped:1").id == image.id  # loaded back from the object store
        await dist.destroy(episode_id="shipped")
        del handle
    finally:
        await dist.close()
        client.images.remove("softprobe-test/shipped:1", force=True)
        client.close()


async def test_a_lost_node_fails_only_its_episodes_and_leaks_nothing(cluster, tmp_path):
    the_cluster, nodes = cluster
    client = docker.from_env()
    dist = await DistributedHost.connect(run_root=str(tmp_path), image=SUPPORT_DESK)
    infos = {}
    for node in dist._nodes:
        info = await node.actor.info.remote()
        infos[info["node_id"]] = info
    slow = [tool("shell.exec", command="sleep 20"), {"type": "terminate"}]
    specs = [{"episode_id": f"lost-{i}", "actions": slow} for i in range(4)]
    batch = asyncio.ensure_future(dist.run_rollouts(specs, concurrency=4))
    doomed_node = next(n for n in nodes if n.node_id in infos)
    doomed_pid = infos[doomed_node.node_id]["pid"]

    def owned(pid: int) -> list[str]:
        return owned_by_process(pid)[0]

    deadline = time.monotonic() + 120
    while len(owned(doomed_pid)) < 2:  # bounded poll: both of its rollouts are running
        assert time.monotonic() < deadline and not batch.done()
        await asyncio.sleep(0.2)
    the_cluster.remove_node(doomed_node)
    outcomes = await batch
    lost = [o.error for o in outcomes if isinstance(o.error, NodeLostError)]
    finished = [o.result for o in outcomes if o.ok]
    assert len(lost) == 2 and len(finished) == 2
    assert all(e.node_id == doomed_node.node_id and doomed_node.node_id[:12] in str(e) for e in lost)
    assert {dist.placements[e.episode_id] for e in lost} == {doomed_node.node_id}
    assert all(o.node_id == doomed_node.node_id for o in outcomes if not o.ok)
    await dist.close()
    # A node comes back: its new host actor sweeps what the dead one left.
    nodes.append(the_cluster.add_node(num_cpus=1, resources={"docker": 1}))
    nodes.remove(doomed_node)
    again = await DistributedHost.connect(run_root=str(tmp_path / "again"), image=SUPPORT_DESK)
    assert owned(doomed_pid) == []
    await again.close()
    client.close()


def test_eval_runs_a_suite_across_the_cluster(cluster, tmp_path):
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    the_cluster, _ = cluster
    examples = Path(__file__).resolve().parents[2] / "images" / "support-desk" / "examples"

    def eval_on_ray(suite: Path, out: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "softprobe.gym.cli", "eval", str(suite), "--out", str(out),
                               "--ray", the_cluster.address], capture_output=True, text=True, timeout=600)

    # Tasks with a bundle do not run on Ray yet: refused up front, nothing started or written.
    refused = eval_on_ray(examples / "suite.yaml", tmp_path / "refused")
    assert refused.returncode == 2 and "cannot run on Ray yet" in refused.stderr
    assert not (tmp_path / "refused" / "results.jsonl").exists()
    # The example suite without its bundle task:
    data = yaml.safe_load((examples / "suite.yaml").read_text())
    data["tasks"] = [task for task in data["tasks"] if "bundle" not in task]
    suite = tmp_path / "suite" / "suite.yaml"
    suite.parent.mkdir()
    suite.write_text(yaml.safe_dump(data))
    shutil.copyfile(examples / "policies.py", suite.parent / "policies.py")
    tmp_path = tmp_path / "out"
    done = eval_on_ray(suite, tmp_path)
    assert done.returncode == 1, done.stderr  # the same outcome as a local run: one task fails on purpose
    results = {r["id"]: r["passed"] for r in map(json.loads, (tmp_path / "results.jsonl").read_text().splitlines())}
    assert results == {"refund-a42": True, "no-refund-a7": True, "list-accounts": True, "note-from-seed": True,
                       "wrong-account-fails": False}
