"""Episodes across a local multi-node Ray cluster whose Docker nodes own two separate engines.

All nodes of ``ray.cluster_utils.Cluster`` run on this machine. One Docker node uses the
machine's main engine; the other one uses a second ``dockerd`` (``.ci/second-engine``: its own
socket, data root and containerd, no bridge, no images at start), named by ``DOCKER_HOST`` in that
Ray node's environment. So image shipping (``docker save`` -> object store -> ``docker load``),
placement, the sweep by a replacement actor and node loss are proven against engines that share
nothing; each claim is checked on the engine itself (its images, its container events, its
containers' labels). Not proven: a real network between machines.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

import docker
import pytest
from helpers import require_extra  # noqa: E402

ray = require_extra("ray", "ray")
Cluster = require_extra("ray.cluster_utils", "ray").Cluster

from helpers import SUPPORT_DESK, tool  # noqa: E402

from softprobe.gym import create_host_environment, create_training_session  # noqa: E402
from softprobe.gym import labels as L  # noqa: E402
from softprobe.gym.errors import ConfigurationError  # noqa: E402
from softprobe.gym.scale.ray import DistributedHost, NodeLostError, RolloutFailedError, RolloutOutcome  # noqa: E402

pytestmark = pytest.mark.docker

# Functions of this module (reward_from) travel to the Ray workers by value: they cannot import it.
ray.cloudpickle.register_pickle_by_value(__import__("sys").modules[__name__])

# The seed image is shipped whole (about 250 MB): room for it in each node's object store.
OBJECT_STORE = 700 * 1024 * 1024


@dataclass
class Topology:
    cluster: Any
    main_node: Any  # Ray node on the machine's main engine
    second_node: Any  # Ray node whose DOCKER_HOST is the second engine
    second_host: str  # the second engine's address
    main: docker.DockerClient
    second: docker.DockerClient
    second_images_before: set[str]  # image ids the second engine had before this module

    def add_second_node(self) -> Any:
        return self.cluster.add_node(num_cpus=1, resources={"docker": 1}, object_store_memory=OBJECT_STORE,
                                     env_vars={"DOCKER_HOST": self.second_host})


@pytest.fixture(scope="module")
def cluster(second_engine):
    main = docker.from_env()
    second = docker.DockerClient(base_url=second_engine)
    images_before = {image.id for image in second.images.list(all=True)}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "object_store_memory": OBJECT_STORE})
    # This node's raylet (and so its actor) inherits this process's environment: the main engine.
    main_node = cluster.add_node(num_cpus=1, resources={"docker": 1}, object_store_memory=OBJECT_STORE)
    topology = Topology(cluster, main_node, None, second_engine, main, second, images_before)
    topology.second_node = topology.add_second_node()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    yield topology
    ray.shutdown()
    cluster.shutdown()
    # What the tests shipped to the second engine goes (only what was not there before).
    for image in second.images.list(all=True):
        if image.id not in images_before:
            second.images.remove(image.id, force=True)
    main.close()
    second.close()


async def actor_infos(dist: DistributedHost) -> dict[str, dict[str, Any]]:
    """node id -> what its host actor reports (pid, host id, engine id)."""
    infos = [await node.actor.info.remote() for node in dist._nodes]
    return {info["node_id"]: info for info in infos}


def owned_on(client: docker.DockerClient, pid: int) -> list[str]:
    """Containers on ``client``'s engine that the process ``pid`` of this machine created."""
    prefix = f"{os.uname().nodename}:{pid}:"
    containers = client.api.containers(all=True, filters={"label": L.MANAGED})
    return sorted(c["Id"] for c in containers if (c.get("Labels") or {}).get(L.OWNER, "").startswith(prefix))


def created_on(client: docker.DockerClient, since: float, host_id: str) -> dict[str, str]:
    """episode id -> image of every container the host ``host_id`` created on ``client``'s engine
    since ``since``, from that engine's own event stream."""
    events = client.api.events(since=int(since), until=int(time.time()) + 1, decode=True, filters={
        "type": "container", "event": "create", "label": f"{L.HOST}={host_id}"})
    return {e["Actor"]["Attributes"][L.EPISODE]: e["Actor"]["Attributes"]["image"] for e in events}


def story(account: str) -> list[dict]:
    return [tool("crm.get_account", id=account), tool("fs.write", path="note.md", content=f"note for {account}"),
            {"type": "terminate"}]


def facts(ctx):
    return {"checks": [{"name": "ok", "passed": ctx.step_result.error is None}]}


async def test_an_engine_that_never_had_the_image_gets_it_shipped(cluster, tmp_path):
    wanted = cluster.main.images.get(SUPPORT_DESK).id
    try:
        present = cluster.second.images.get(SUPPORT_DESK).id
    except docker.errors.ImageNotFound:
        present = None
    if present is not None:  # an earlier test of this module shipped it: ours to remove
        assert present not in cluster.second_images_before, "the second engine must start without the seed image"
        cluster.second.images.remove(present, force=True)
    started = time.time()
    dist = await DistributedHost.connect(run_root=str(tmp_path), image=SUPPORT_DESK)
    try:
        infos = await actor_infos(dist)
        # Each node's actor owns the engine its node's environment names: two different daemons.
        assert infos[cluster.main_node.node_id]["engine_id"] == cluster.main.info()["ID"]
        assert infos[cluster.second_node.node_id]["engine_id"] == cluster.second.info()["ID"]
        assert infos[cluster.second_node.node_id]["docker_host"] == cluster.second_host
        with pytest.raises(docker.errors.ImageNotFound):
            cluster.second.images.get(SUPPORT_DESK)
        connected = time.time()
        handles = [await dist.create_episode(episode_id=f"ship-{i}") for i in range(2)]  # one per node
        shipped_s = time.time() - connected
        placed = {h.episode_id: dist.node_of(h.episode_id) for h in handles}
        assert set(placed.values()) == {cluster.main_node.node_id, cluster.second_node.node_id}
        # Loaded by the library from the driver's engine: the very same image (id), tag included.
        assert cluster.second.images.get(SUPPORT_DESK).id == wanted
        for h in handles:
            await dist.reset(episode_id=h.episode_id)
            step = await dist.step(episode_id=h.episode_id, action=tool("crm.get_account", id="A-42"))
            assert step.observation["id"] == "A-42"
        # Each engine's own event stream shows the episode placed on it, and only that one.
        for node, client in ((cluster.main_node, cluster.main), (cluster.second_node, cluster.second)):
            created = created_on(client, started, infos[node.node_id]["host_id"])
            assert {e for e in created if e.startswith("ship-")} == {e for e, n in placed.items() if n == node.node_id}
    finally:
        await dist.close()
    assert owned_on(cluster.second, infos[cluster.second_node.node_id]["pid"]) == []
    print(f"\n[ray] connected in {connected - started:.1f} s; seed image shipped to the second engine "
          f"and both episodes created in {shipped_s:.1f} s")


async def test_engines_name_each_nodes_engine_explicitly(cluster, tmp_path):
    both_on_second = {cluster.main_node.node_id: cluster.second_host}  # overrides that node's environment
    dist = await DistributedHost.connect(run_root=str(tmp_path), image=SUPPORT_DESK, engines=both_on_second)
    try:
        infos = await actor_infos(dist)
        assert {info["engine_id"] for info in infos.values()} == {cluster.second.info()["ID"]}
    finally:
        await dist.close()
    with pytest.raises(ConfigurationError, match="not alive Docker nodes of this cluster: no-such-node"):
        await DistributedHost.connect(run_root=str(tmp_path), engines={"no-such-node": cluster.second_host})


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
    since = time.time()
    dist = await DistributedHost.connect(run_root=str(tmp_path / "dist"), image=SUPPORT_DESK)
    try:
        infos = await actor_infos(dist)
        remote = [outcome.unwrap() for outcome in await dist.run_rollouts(specs, concurrency=8)]
        remote_s = time.perf_counter() - started
        assert len(set(dist.placements[s["episode_id"]] for s in specs)) == 2
    finally:
        await dist.close()
    # Placed on both engines: each engine's own events name exactly the rollouts placed on its node.
    for node, client in ((cluster.main_node, cluster.main), (cluster.second_node, cluster.second)):
        created = created_on(client, since, infos[node.node_id]["host_id"])
        on_node = {s["episode_id"] for s in specs if dist.placements[s["episode_id"]] == node.node_id}
        assert on_node and {e for e in created if e.startswith("batch-")} == on_node
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
    print(f"\n[ray] 8 rollouts: local {local_s:.2f} s, two nodes on two engines {remote_s:.2f} s (incl. connect)")


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


async def test_a_lost_node_fails_only_its_episodes_and_its_engine_is_swept(cluster, tmp_path):
    dist = await DistributedHost.connect(run_root=str(tmp_path), image=SUPPORT_DESK)
    infos = await actor_infos(dist)
    doomed = cluster.second_node  # the node on the second engine
    doomed_pid = infos[doomed.node_id]["pid"]
    slow = [tool("shell.exec", command="sleep 20"), {"type": "terminate"}]
    specs = [{"episode_id": f"lost-{i}", "actions": slow} for i in range(4)]
    batch = asyncio.ensure_future(dist.run_rollouts(specs, concurrency=4))
    deadline = time.monotonic() + 120
    while len(owned_on(cluster.second, doomed_pid)) < 2:  # bounded poll: both of its rollouts are running
        assert time.monotonic() < deadline and not batch.done()
        await asyncio.sleep(0.2)
    cluster.cluster.remove_node(doomed)
    outcomes = await batch
    lost = [o.error for o in outcomes if isinstance(o.error, NodeLostError)]
    finished = [o for o in outcomes if o.ok]
    assert len(lost) == 2 and len(finished) == 2
    assert all(e.node_id == doomed.node_id and doomed.node_id[:12] in str(e) for e in lost)
    assert {dist.placements[e.episode_id] for e in lost} == {doomed.node_id}
    assert {o.node_id for o in finished} == {cluster.main_node.node_id}  # the main engine's rollouts finished
    await dist.close()
    left = owned_on(cluster.second, doomed_pid)
    assert len(left) == 2  # the dead actor's containers are still on its engine...
    # ...next to an object of a live owner (this test process), which a sweep must keep.
    bystander = cluster.second.api.create_container(SUPPORT_DESK, command=["true"], labels={
        L.MANAGED: "true", L.OWNER: L.current_owner(), L.HOST: "bystander"},
        host_config=cluster.second.api.create_host_config(network_mode="none"))["Id"]
    try:
        # A node comes back on that engine: its new host actor sweeps what the dead one left.
        cluster.second_node = cluster.add_second_node()
        again = await DistributedHost.connect(run_root=str(tmp_path / "again"), image=SUPPORT_DESK)
        try:
            assert owned_on(cluster.second, doomed_pid) == []
            assert cluster.second.api.inspect_container(bystander)["Id"] == bystander
        finally:
            await again.close()
    finally:
        cluster.second.api.remove_container(bystander, force=True)


def test_eval_runs_a_suite_across_the_cluster(cluster, tmp_path):
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    the_cluster = cluster.cluster
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
