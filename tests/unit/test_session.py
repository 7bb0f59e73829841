"""Training sessions: rollouts as event streams, rewards from facts, finished results (on the
local provider with the support-desk tools)."""

from __future__ import annotations

import json
import re

import pytest
from helpers import tool

from softprobe.gym import (
    LifecycleError,
    RewardComponent,
    RewardError,
    create_host_environment,
    create_training_session,
    map_reward_components,
    rollout_to_promptfoo_input,
)


async def has_note(ctx):
    return {"workspace_had_note": await ctx.exists("refund-note.md")}


def note_facts(ctx):
    return {
        "checks": [{"name": "note_written", "passed": bool(ctx.step_result.diagnostics.get("workspace_had_note"))}],
        "workspace_digest": ctx.step_result.diagnostics.get("workspace_digest"),
    }


STORY = [
    {"type": "tool", "name": "crm.get_account", "args": {"id": "A-42"}},
    {"type": "tool", "name": "fs.write", "args": {"path": "refund-note.md"}},
    {"type": "terminate"},
]


@pytest.fixture
async def host(tmp_path, desk_provider):
    """A host with the support-desk tools whose hook reports whether the note exists."""
    async with create_host_environment(run_root=tmp_path / "run", provider=desk_provider, on_step=has_note) as env:
        yield env


async def collect(session, source):
    return [event async for event in session.rollout(source)]


async def test_a_scripted_rollout_yields_reset_steps_and_terminated(host):
    session = await create_training_session(host, episode_id="train-A-42", reward_from=note_facts)
    events = await collect(session, STORY)
    assert [e.type for e in events] == ["reset", "step", "step", "step", "terminated"]
    values = [e.step_result.reward_components for e in events if e.type == "step"]
    assert values[0] == [RewardComponent(kind="check", name="note_written", value=0.0)]
    assert values[1] == [RewardComponent(kind="check", name="note_written", value=1.0)]
    assert [e.step_result.reward for e in events if e.type == "step"] == [0.0, 1.0, 1.0]
    trace = events[0].source_trace_id
    assert re.fullmatch(r"[0-9a-f]{32}", trace)
    assert all(e.step_result.source_trace_id == trace for e in events if e.type == "step")
    assert events[-1].reason == "terminate_action" and events[-1].steps == 3

    result = await session.finalize()
    assert result.total_reward == 2.0 and result.terminated_reason == "terminate_action"
    assert "A-42" in result.final_output and "refund-note.md" in result.final_output  # a transcript
    assert result.trajectory_digest.startswith("sha256:") and result.source_trace_id == trace
    assert (result.workspace_path / "refund-note.md").exists()
    saved = json.loads((result.artifacts_dir / "rollout.json").read_text())
    assert saved["trajectory_digest"] == result.trajectory_digest
    pf = rollout_to_promptfoo_input(result)
    assert [s.tool for s in pf.steps] == ["crm.get_account", "fs.write", None]
    assert pf.steps[0].args == {"id": "A-42"} and pf.steps[0].observation["id"] == "A-42"


async def test_a_policy_drives_the_rollout_from_observations(host):
    seen = []

    async def policy(observation, last):
        seen.append((type(observation).__name__, last.index if last else None))
        if last is None:
            return tool("crm.list_accounts")
        if last.action.name == "crm.list_accounts":
            first = observation[0]["id"]
            return tool("fs.write", path="first.txt", content=first)
        return {"type": "terminate", "output": "wrote the first account"}

    session = create_training_session(host, reward_from=note_facts)  # used directly, not awaited
    events = await collect(session, policy)
    assert seen == [("dict", None), ("list", 1), ("str", 2)]
    assert events[-1].reason == "terminate_action"
    result = await session.finalize()
    assert result.final_output == "wrote the first account"
    assert (result.workspace_path / "first.txt").read_text() == "A-42"


async def test_a_one_argument_sync_policy_and_a_policy_that_stops(host):
    steps = iter([tool("fs.list"), tool("fs.list"), None])
    session = create_training_session(host)
    events = await collect(session, lambda observation: next(steps))
    assert events[-1].reason == "end_of_actions" and events[-1].steps == 2
    assert events[1].step_result.reward is None  # no reward_from: no rewards


async def test_max_steps_truncates_the_rollout(host):
    session = create_training_session(host, reward_from=note_facts, max_steps=3)
    events = await collect(session, lambda obs: tool("fs.list"))
    steps = [e.step_result for e in events if e.type == "step"]
    assert len(steps) == 3 and steps[-1].truncated and not steps[-1].terminated
    assert events[-1].reason == "max_steps"


async def test_a_raising_reward_from_fails_the_step_with_a_clear_error(host):
    def explode(ctx):
        if ctx.step_index == 2:
            raise ZeroDivisionError("bad maths")
        return note_facts(ctx)

    session = create_training_session(host, reward_from=explode)
    events = []
    with pytest.raises(RewardError, match="reward_from raised ZeroDivisionError at step 2: bad maths") as caught:
        async for event in session.rollout(STORY):
            events.append(event)
    assert events[-1].type == "terminated" and events[-1].reason == "error"
    assert "bad maths" in events[-1].error
    assert caught.value.step_result.index == 2


@pytest.mark.parametrize(
    "facts, message",
    [
        ({"checks": [{"name": "note_written", "passed": "yes"}]}, "check 'note_written' field 'passed'"),
        ({"checks": [{"passed": True}]}, "check #1 field 'name'"),
        ({"checks": [{"name": "a", "passed": True}, {"name": "a", "passed": False}]}, "check 'a' more than once"),
        ({"metrics": {"m": float("nan")}}, "not a finite number: 'm'"),
        (["not", "facts"], "must return a dict"),
    ],
)
async def test_malformed_facts_name_the_check(host, facts, message):
    session = create_training_session(host, reward_from=lambda ctx: facts)
    with pytest.raises(RewardError, match=message):
        await collect(session, STORY)


async def test_a_check_that_disappears_is_an_error_not_a_silent_zero(host):
    def fickle(ctx):
        checks = [{"name": "note_written", "passed": False}] if ctx.step_index == 1 else []
        return {"checks": checks}

    session = create_training_session(host, reward_from=fickle)
    with pytest.raises(RewardError, match="check 'note_written' disappeared at step 2"):
        await collect(session, STORY)


async def test_trajectory_digests_are_equal_for_equal_rollouts_only(host):
    async def run(actions, episode_id):
        session = create_training_session(host, episode_id=episode_id, reward_from=note_facts)
        await collect(session, actions)
        return (await session.finalize()).trajectory_digest

    first = await run(STORY, "same-1")
    second = await run(STORY, "same-2")
    other = await run([STORY[0], tool("fs.write", path="refund-note.md", content="x"), STORY[2]], "other")
    assert first == second != other


def test_map_reward_components_is_public_and_orders_checks_then_metrics():
    components = map_reward_components(
        {"checks": [{"name": "a", "passed": True}, {"name": "b", "passed": False}], "metrics": {"speed": 2.5}}
    )
    assert [(c.kind, c.name, c.value) for c in components] == [
        ("check", "a", 1.0), ("check", "b", 0.0), ("metric", "speed", 2.5)
    ]


async def test_reward_aggregate_is_configurable(host):
    def facts(ctx):
        return {"checks": [{"name": "a", "passed": True}, {"name": "b", "passed": False}]}

    session = create_training_session(host, reward_from=facts, reward_aggregate="mean")
    events = await collect(session, [tool("fs.list")])
    assert events[1].step_result.reward == 0.5
    session = create_training_session(host, reward_from=facts, reward_aggregate=lambda cs: -len(cs))
    events = await collect(session, [tool("fs.list")])
    assert events[1].step_result.reward == -2.0


async def test_leaving_a_rollout_early_releases_the_session_at_once(host):
    session = await create_training_session(host, episode_id="early-exit")
    async for event in session.rollout(STORY):
        assert event.type == "reset"
        break  # the iterator is dropped here: the session is free again at once
    events = await collect(session, STORY)
    assert [e.type for e in events] == ["reset", "step", "step", "step", "terminated"]

    kept = session.rollout(STORY)  # a reference we keep: aclose() releases it
    assert (await kept.__anext__()).type == "reset"
    with pytest.raises(LifecycleError, match="one rollout at a time"):
        await session.rollout(STORY).__anext__()
    await kept.aclose()
    await kept.aclose()  # idempotent
    assert [e.type async for e in kept] == []
    assert (await collect(session, STORY))[-1].reason == "terminate_action"


async def test_each_step_is_written_whole_with_rewards_and_trace_id_as_it_completes(host):
    session = await create_training_session(host, episode_id="logged", reward_from=note_facts)
    log = host.run_root / "episodes" / "logged" / "trajectory.jsonl"
    async for event in session.rollout(STORY):
        if event.type == "step":  # read the log before the session finalizes anything
            line = json.loads(log.read_text().splitlines()[-1])
            assert line["index"] == event.step_result.index
            assert line["reward_components"] == [c.model_dump() for c in event.step_result.reward_components] != []
            assert line["reward"] == event.step_result.reward
            assert line["source_trace_id"] == session.source_trace_id


async def test_a_step_whose_hook_raised_is_recorded_alike_by_the_session_and_the_host(tmp_path, desk_provider):
    from softprobe.gym import OnStepHookError

    def hook(ctx):
        if ctx.result.index == 2:
            raise RuntimeError("hook broke")
        return {"workspace_had_note": False}

    async with create_host_environment(run_root=tmp_path / "run", provider=desk_provider, on_step=hook) as host:
        session = await create_training_session(host, episode_id="hooked", reward_from=note_facts)
        with pytest.raises(OnStepHookError, match="hook broke"):
            await collect(session, STORY)
        result = await session.finalize()
        logged = (host.run_root / "episodes" / "hooked" / "trajectory.jsonl").read_text().splitlines()
        assert [s.index for s in result.steps] == [1, 2]
        assert [json.loads(s.model_dump_json()) for s in result.steps] == [json.loads(line) for line in logged]
