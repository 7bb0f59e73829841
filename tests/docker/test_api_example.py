"""API.md section 1, exactly as written there: the contract users port their code with."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from softprobe.gym import create_host_environment
from softprobe.gym.episodes.store import remove_tree

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


# -- section 3, as written --------------------------------------------------------------------

from softprobe.gym import create_training_session, rollout_to_promptfoo_input  # noqa: E402
from softprobe.promptfoo_adapter import execute_promptfoo_eval  # noqa: E402


async def section_3():
    async def has_note(ctx):
        return {"workspace_had_note": await ctx.exists("refund-note.md")}

    host = create_host_environment(run_root="/tmp/softprobe-gym/train", seed_root="/tmp/softprobe-gym/seed",
                                   image="softprobe/support-desk:latest", on_step=has_note)
    session = await create_training_session(host, episode_id="train-A-42", reward_from=lambda ctx: {
        "checks": [{"name": "note_written", "passed": bool(ctx.step_result.diagnostics.get("workspace_had_note"))}],
        "workspace_digest": ctx.step_result.diagnostics.get("workspace_digest"),
    })
    seen = []
    async for ev in session.rollout([
        {"type": "tool", "name": "crm.get_account", "args": {"id": "A-42"}},
        {"type": "tool", "name": "fs.write", "args": {"path": "refund-note.md"}},
        {"type": "terminate"},
    ]):
        if ev.type == "step":
            print(ev.step_result.reward_components)   # [RewardComponent(kind="check", name="note_written", value=1.0)]
            seen.append(ev.step_result.reward_components)
    result = await session.finalize()
    pf = rollout_to_promptfoo_input(result)           # pf.final_output, pf.trajectory_digest, pf.source_trace_id
    graded = await execute_promptfoo_eval(
        attempt_id="fatt_train_A-42", final_output=pf.final_output,
        trajectory_digest=pf.trajectory_digest, source_trace_id=pf.source_trace_id,
        assertions=[{"type": "contains", "value": "A-42"}],
    )
    # graded.passed, graded.score, graded.reason, graded.component_results,
    # graded.error (None unless the test is an ERROR rather than a FAIL), graded.backend
    await host.close()  # not in API.md: the test must leave nothing behind
    return seen, result, graded


def test_section_3_runs_as_written(docker_engine):
    os.makedirs("/tmp/softprobe-gym/seed", exist_ok=True)
    # The example's run_root and episode id are fixed and it keeps its records; a host refuses an
    # episode folder that already holds some (EpisodeExistsError), so an earlier run's go first.
    remove_tree(Path("/tmp/softprobe-gym/train/episodes/train-A-42"))
    seen, result, graded = asyncio.run(section_3())
    assert [[c.value for c in components] for components in seen] == [[0.0], [1.0], [1.0]]
    assert all(c.name == "note_written" and c.kind == "check" for components in seen for c in components)
    assert graded.passed and graded.score == 1.0 and graded.error is None and graded.backend == "native"
    assert graded.trajectory_digest == result.trajectory_digest
    assert graded.source_trace_id == result.source_trace_id
