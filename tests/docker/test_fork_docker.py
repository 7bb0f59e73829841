"""Checkpoint images on the engine: a fork's image stays while a child runs from it and goes
with its last user. The fork logic itself is tested on the local provider (tests/unit/test_fork.py)."""

from __future__ import annotations

import docker
import pytest
from helpers import ALL_CAPS, SUPPORT_DESK, NullSubject, ready

from softprobe.gym import create_host_environment

pytestmark = pytest.mark.docker




async def test_checkpoint_images_go_with_their_last_user(tmp_path, docker_engine):
    async with create_host_environment(
        run_root=tmp_path, image=SUPPORT_DESK, capabilities=ALL_CAPS, subject=NullSubject()
    ) as host:
        client = docker.from_env()
        parent = await ready(host, "parent")
        ckpt = await host.checkpoint(episode_id=parent)
        child = await host.fork(episode_id=parent, path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)
        await host.destroy(episode_id=parent, cleanup=True)
        client.images.get(ckpt.image_id)  # the child still runs from it
        await host.destroy(episode_id=child.episode_id, cleanup=True)
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(ckpt.image_id)
        client.close()
