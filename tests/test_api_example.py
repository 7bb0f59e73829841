"""API.md section 1, exactly as written there: the contract users port their code with."""

from __future__ import annotations

import asyncio
import os

import pytest

from softprobe.gym import create_host_environment

pytestmark = pytest.mark.docker


async def main():
    os.makedirs("/tmp/softprobe-gym/seed", exist_ok=True)       # seed files; may be empty
    host = create_host_environment(
        run_root="/tmp/softprobe-gym/run",                       # per-process scratch space
        seed_root="/tmp/softprobe-gym/seed",                     # copied into /workspace on reset
        image="softprobe/support-desk:latest",                   # seed image (default: softprobe/base:latest)
    )
    created = await host.create_episode(episode_id="ep-support-1")   # episode_id optional
    episode_id = created.episode_id
    obs0 = await host.reset(episode_id=episode_id)                   # fresh container + seed files
    step1 = await host.step(
        episode_id=episode_id,
        action={"type": "tool", "name": "crm.get_account", "args": {"id": "A-42"}},
    )
    # step1.observation, step1.diagnostics["workspace_digest"], step1.terminated, step1.truncated
    ckpt = await host.checkpoint(episode_id=episode_id)              # ckpt.checkpoint_id
    done = await host.finalize(episode_id=episode_id)
    await host.destroy(episode_id=episode_id, cleanup=True)
    await host.close()            # or: async with create_host_environment(...) as host:
    return obs0, step1, ckpt, done


def test_section_1_runs_as_written(docker_engine):
    obs0, step1, ckpt, done = asyncio.run(main())
    assert "crm.get_account" in obs0.observation["tools"]
    assert step1.observation["id"] == "A-42"
    assert step1.diagnostics["workspace_digest"].startswith("sha256:")
    assert step1.terminated is False and step1.truncated is False
    assert ckpt.checkpoint_id and ckpt.step_index == 1
    assert done.steps == 1
    assert not done.episode_dir.exists()  # destroy(cleanup=True) removed it
