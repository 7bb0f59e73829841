"""Chains of checkpoint -> fork -> checkpoint never hit Docker's layer-depth limit.

This is row 18 of SECURITY.md's threat list (test_security_matrix.py defers to it).
"""

from __future__ import annotations

import time

import docker
import pytest
from helpers import SUPPORT_DESK, ready, tool

from softprobe.gym import create_host_environment
from softprobe.gym.providers.docker.provider import FLATTEN_AT_LAYERS, DockerProvider

pytestmark = pytest.mark.docker
CAPS = {"environment_checkpoint": True, "subject_state_import": True, "deterministic_prefix_reexecution": True}


class NullSubject:
    def export_state(self, episode_id):
        return None

    def import_state(self, episode_id, state):
        return None


def layers(client: docker.DockerClient, image_id: str) -> int:
    return len(client.images.get(image_id).attrs["RootFS"]["Layers"])


async def test_a_flattened_checkpoint_keeps_world_user_tools_and_environment(tmp_path, seed_root, docker_engine):
    client = docker.from_env()
    base_layers = layers(client, SUPPORT_DESK)
    provider = DockerProvider(flatten_at_layers=base_layers + 3)
    async with create_host_environment(
        run_root=tmp_path, seed_root=seed_root, image=SUPPORT_DESK, capabilities=CAPS,
        subject=NullSubject(), provider=provider,
    ) as host:
        current = await ready(host, "gen-0")
        depths = []
        for generation in range(1, 5):
            await host.step(episode_id=current, action=tool("fs.write", path=f"gen-{generation}.txt", content="x"))
            ckpt = await host.checkpoint(episode_id=current)
            depths.append(layers(client, ckpt.image_id))
            child = await host.fork(episode_id=current, path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)
            current = child.episode_id
        assert depths == [base_layers + 1, base_layers + 2, 1, 2]  # flattened at the threshold
        assert FLATTEN_AT_LAYERS < 125  # the default leaves room below Docker's limit
        probe = await host.step(
            episode_id=current,
            action=tool("shell.exec", command="id -u; echo $HOME; ls /workspace | wc -l; cat /etc/softprobe/tools.json | head -c 1"),
        )
        uid, *rest = probe.observation.split()
        assert rest == ["/tmp/.home", "6", "{"]  # HOME is on the bounded /tmp
        assert uid == str(host.runtime_of(episode_id=current).hello.uid)  # the child's own uid
        account = await host.step(episode_id=current, action=tool("crm.get_account", id="A-42"))
        assert account.observation["id"] == "A-42"
    await provider.close()  # given to the host, so the caller's to close
    client.close()


@pytest.mark.slow
async def test_more_than_130_checkpoint_fork_generations(tmp_path, docker_engine, capsys):
    generations = 135
    client = docker.from_env()
    started = time.perf_counter()
    async with create_host_environment(
        run_root=tmp_path, image=SUPPORT_DESK, capabilities=CAPS, subject=NullSubject()
    ) as host:
        current = await ready(host, "gen-0")
        deepest = 0
        for generation in range(1, generations + 1):
            await host.step(episode_id=current, action=tool("fs.write", path=f"g/{generation}", content=str(generation)))
            ckpt = await host.checkpoint(episode_id=current)
            deepest = max(deepest, layers(client, ckpt.image_id))
            child = await host.fork(episode_id=current, path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)
            await host.destroy(episode_id=current, cleanup=True)
            current = child.episode_id
        listing = await host.step(episode_id=current, action=tool("fs.list", path="g"))
        assert len(listing.observation) == generations
        assert deepest < FLATTEN_AT_LAYERS <= 125
    duration = time.perf_counter() - started
    with capsys.disabled():
        print(f"\n[depth] {generations} checkpoint->fork generations in {duration:.1f} s, deepest image {deepest} layers")
    client.close()
