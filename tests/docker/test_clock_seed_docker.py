"""The time policy and random seed on the real engine (``softprobe/base`` has libfaketime):
a recorded clock starts where the tape says, far in the past if the tape says so; record then
replay gives the same clock start, the same seeded randomness and the same ``hash("x")``; the
agent can change neither the seed file nor a tool's clock."""

from __future__ import annotations

import json
import time

import docker
import pytest
from helpers import tool

from softprobe.gym import create_host_environment
from softprobe.gym import labels as L
from softprobe.gym.tapes import ClosureReport, TapeFolder
from softprobe.gym.tapes.canonical import canonical_json, sha256_digest

pytestmark = pytest.mark.docker

PROBE = (
    "python3 -c 'import os, random, time; "
    "print(int(time.time()), random.Random(int(os.environ[\"SOFTPROBE_RANDOM_SEED\"])).random(), hash(\"x\"))'"
    " && cat /opt/softprobe/seed && stat -c '%u %a' /opt/softprobe/seed"
)
#: 2001-09-09: far enough in the past that the live clock can never be mistaken for it.
PAST = 1_000_000_000


def _probe(observation: str) -> tuple[int, str, str, str, str]:
    lines = observation.split("\n")
    now, value, hashed = lines[0].split()
    return int(now), value, hashed, lines[1].strip(), lines[2].strip()


def _lines(report: ClosureReport) -> list[tuple[str, str, str, str]]:
    return [(d.category, d.operation, d.provider, d.call_site) for d in report.dependencies
            if d.category in ("CLOCK", "RANDOM")]


def _with_clock_start(source: TapeFolder, target: TapeFolder, epoch_s: int) -> None:
    """Copy ``source`` into ``target`` with its CLOCK entry's instant replaced (tapes API only)."""
    target.start()
    for entry in source.entries():
        for ref in (entry.request.payload_ref, entry.response.payload_ref):
            target.put_payload(source.get_payload(ref))
        if entry.category == "CLOCK":
            ref = target.put_payload(canonical_json({"epoch_s": epoch_s}))
            entry = entry.model_copy(update={"response": entry.response.model_copy(update={"payload_ref": ref})})
        target.append(entry)


async def test_record_then_replay_same_clock_start_and_seed_and_a_past_clock_from_the_tape(tmp_path):
    client = docker.from_env()
    host_ids = []
    async with create_host_environment(run_root=tmp_path / "rec", tape_mode="record",
                                       time_policy="recorded") as host:
        host_ids.append(host.host_id)
        await host.create_episode(episode_id="ep")
        before = int(time.time())
        reset = await host.reset(episode_id="ep")
        clock = reset.diagnostics["clock"]
        assert clock["time_shim"] is True and clock["notes"] == []
        assert before - 1 <= clock["clock_start"] <= int(time.time()) + 1
        assert "time_shim" in host.runtime_of(episode_id="ep").hello.capabilities
        recorded = await host.step(episode_id="ep", action=tool("shell.exec", command=PROBE))
        # The agent cannot change the seed file (root's, 0644, in a root-only folder).
        tamper = await host.step(episode_id="ep", action=tool("shell.exec", command="echo 7 > /opt/softprobe/seed"))
        final = await host.finalize(episode_id="ep")
    assert recorded.error is None, recorded.observation
    t0, value, hashed, seed_file, owner = _probe(recorded.observation)
    assert clock["clock_start"] <= t0 <= clock["clock_start"] + 5
    assert seed_file == str(clock["random_seed"]) and owner == "0 644"
    assert tamper.error is not None and tamper.error.type == "command_failed"
    tape = TapeFolder(final.episode_dir / "tape")
    entries = tape.entries()
    assert [(e.category, e.operation, e.call_site) for e in entries] == [
        ("CLOCK", "clock.start", "reset"), ("RANDOM", "random.seed", "reset")]
    report = ClosureReport.model_validate_json(final.closure_report_path.read_text())
    assert _lines(report) == [("CLOCK", "clock.start", "seeded", "reset"),
                              ("RANDOM", "random.seed", "seeded", "reset"),
                              ("RANDOM", "urandom", "live", "step:1")]
    assert report.run_level == "live"  # the command itself ran for real (CHILD_PROCESS live)

    past = TapeFolder(tmp_path / "past-tape")
    _with_clock_start(tape, past, PAST)
    assert not past.verify()
    outputs = {}
    for name, folder in (("same", tape), ("past", past)):
        async with create_host_environment(run_root=tmp_path / name, tape_mode="replay", tape=folder.root,
                                           time_policy="recorded") as host:
            host_ids.append(host.host_id)
            await host.create_episode(episode_id="ep")
            reset = await host.reset(episode_id="ep")
            step = await host.step(episode_id="ep", action=tool("shell.exec", command=PROBE))
            replay_final = await host.finalize(episode_id="ep")
        assert step.error is None, step.observation
        outputs[name] = (reset.diagnostics["clock"], _probe(step.observation), replay_final)
    same_clock, same_probe, same_final = outputs["same"]
    assert same_clock["clock_start"] == clock["clock_start"] and same_clock["random_seed"] == clock["random_seed"]
    assert clock["clock_start"] <= same_probe[0] <= clock["clock_start"] + 5
    assert same_probe[1:] == (value, hashed, seed_file, owner)  # same seeded draw, same hash("x")
    replay_report = ClosureReport.model_validate_json(same_final.closure_report_path.read_text())
    clock_line = next(d for d in replay_report.dependencies if d.category == "CLOCK")
    assert (clock_line.provider, clock_line.call_site) == ("recorded", "reset")
    assert clock_line.canonical_request_digest == sha256_digest(canonical_json({"clock": "start"}))
    assert clock_line.available_capabilities == ["tape_replay"]
    past_clock, past_probe, _ = outputs["past"]
    assert past_clock["clock_start"] == PAST
    assert PAST <= past_probe[0] <= PAST + 5  # not now: the tape's instant
    assert past_probe[1:3] == (value, hashed)
    for host_id in host_ids:
        assert client.containers.list(all=True, filters={"label": f"{L.HOST}={host_id}"}) == []
    client.close()


async def test_a_declared_tool_gets_the_clock_and_seed_and_the_agent_cannot_take_them_away(tmp_path):
    """An overlay-declared tool runs with the shim's environment. Each program starts at T0, so
    after a command slept 3 s the tool still starts at T0; the agent's command that unsets
    LD_PRELOAD for itself sees the live clock, which changes nothing for the tool after it."""
    probe = ("import os, time, json; print(json.dumps({'t': int(time.time()), "
             "'seed': os.environ.get('SOFTPROBE_RANDOM_SEED'), 'hashseed': os.environ.get('PYTHONHASHSEED')}))")
    tools = [{"name": "probe.clock", "command": ["python3", "-c", probe], "output": "json"}]
    async with create_host_environment(run_root=tmp_path / "run", time_policy="recorded", random_seed=1234,
                                       tools=tools) as host:
        await host.create_episode(episode_id="ep")
        clock = (await host.reset(episode_id="ep")).diagnostics["clock"]
        start = clock["clock_start"]
        escaped = await host.step(episode_id="ep", action=tool(
            "shell.exec", command="sleep 3 && env -u LD_PRELOAD python3 -c 'import time; print(int(time.time()))'"))
        pinned = await host.step(episode_id="ep", action=tool("probe.clock"))
        # libfaketime's shared memory of earlier steps is gone: only this command's own pair.
        shm = await host.step(episode_id="ep", action=tool("shell.exec", command="ls /dev/shm"))
        final = await host.finalize(episode_id="ep")
    assert clock["random_seed"] == 1234 and clock["time_shim"] is True
    assert clock["notes"] == ["clock_start_not_taped"]
    assert escaped.error is None and int(escaped.observation) >= start + 3  # its own choice: the live clock
    assert pinned.error is None, pinned
    assert start <= pinned.observation["t"] <= start + 2  # started at T0 again, 3 s later
    assert pinned.observation["seed"] == "1234" and pinned.observation["hashseed"] == "1234"
    assert len([name for name in shm.observation.split() if "faketime" in name]) == 2
    report = ClosureReport.model_validate_json(final.closure_report_path.read_text())
    # Without a tape the clock start is consistent within the episode, not reproducible after it.
    assert _lines(report) == [("CLOCK", "clock.start", "live", "step:1"),
                              ("RANDOM", "random.seed", "seeded", "reset"),
                              ("RANDOM", "urandom", "live", "step:1")]
    clock_line = next(d for d in json.loads(final.closure_report_path.read_text())["dependencies"]
                      if d["category"] == "CLOCK")
    assert clock_line["note"] == "clock_start_not_taped"
