"""Workspace change sets and CHILD_PROCESS entries on the real engine: record an episode whose
shell commands and a declared tool write and delete workspace files, replay it in a fresh
container without running any of them, and refuse forged change sets.

Every command (and the tool) also appends a line to ``/tmp/ran`` (``/tmp/ran-tool``) in their container, outside the
workspace and outside any change set: a replayed or prefix-served step that ran would leave it
there, so its absence shows nothing ran."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest
from helpers import ready, tool

from softprobe.gym import create_host_environment
from softprobe.gym import labels as L
from softprobe.gym.tapes import ClosureReport, TapeFolder, read_entries
from softprobe.gym.tapes import changes as C
from softprobe.gym.tapes.canonical import canonical_json

pytestmark = pytest.mark.docker
CAPS = {"environment_checkpoint": True, "subject_state_import": False, "deterministic_prefix_reexecution": True}

WRITER = """
import json, os, sys
args = json.load(sys.stdin)
with open("/tmp/ran-tool", "a") as f:  # its own file: the tool runs under another uid
    f.write("tool\\n")
root = os.environ["SOFTPROBE_WORKSPACE"]
os.remove(os.path.join(root, "out", "stale.txt"))
with open(os.path.join(root, "out", "report.txt"), "w") as f:
    f.write("report " + args["who"])
print(json.dumps({"made": "out/report.txt"}))
"""
REPORT = {"name": "svc.report", "description": "Write a report.", "args": {"type": "object"},
          "command": ["python3", "${SOFTPROBE_OVERLAY}/writer.py"], "output": "json", "timeout_s": 20}

ACTIONS = [
    # (out/ is open to the tool's uid: it writes out/report.txt and deletes out/stale.txt)
    tool("shell.exec", command="echo shell >> /tmp/ran; mkdir -p d/e && printf x > d/e/f.txt && chmod 600 d/e/f.txt "
                               "&& ln -s d/e/f.txt link && rm old.txt && mkdir -m 777 out && printf s > out/stale.txt && echo made"),
    tool("svc.report", who="a"),
    tool("shell.exec", command="echo shell >> /tmp/ran; rm -r d; printf new > keep.txt; cat keep.txt; date +%N"),
    tool("fs.write", path="notes.md", content="hi"),
    tool("shell.exec", command="echo shell >> /tmp/ran; exit 3"),
    tool("shell.exec", command="echo shell >> /tmp/ran; ls -R; od -An -N8 -tx8 /dev/urandom"),
]


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path]:
    seed, files = tmp_path / "seed", tmp_path / "tools"
    seed.mkdir()
    files.mkdir()
    (seed / "old.txt").write_text("old")
    (seed / "keep.txt").write_text("keep")
    (files / "writer.py").write_text(WRITER)
    return seed, files


def _host(tmp_path, world, name, **kwargs):  # type: ignore[no-untyped-def]
    seed, files = world
    return create_host_environment(run_root=tmp_path / name, seed_root=seed, tools=[REPORT], tool_files=files,
                                   capabilities=CAPS, **kwargs)


def _ran(client, host, episode_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The lines of /tmp/ran and /tmp/ran-tool in the episode's container (none: no file)."""
    runtime = host.runtime_of(episode_id=episode_id)
    result = client.containers.get(runtime.sandbox_id).exec_run(["sh", "-c", "cat /tmp/ran /tmp/ran-tool 2>/dev/null || true"])
    return result.output.decode().split()


def _forge(tape: TapeFolder, sequence: int, entries: list[C.ChangeEntry]) -> None:
    """Point entry ``sequence``'s sidecar line at a well-formed change set of ``entries``."""
    record = C.records(tape)[sequence]
    forged = C.load(tape, record).model_copy(update={"entries": entries})
    ref = tape.put_payload(canonical_json(forged.model_dump(by_alias=True, exclude_none=True)))
    lines = [json.loads(line) for line in (tape.root / "workspace-effects.jsonl").read_text().splitlines()]
    for line in lines:
        if line["sequence"] == sequence:
            line["changes_ref"] = ref
    (tape.root / "workspace-effects.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


async def test_record_then_replay_runs_nothing_and_reproduces_every_digest(tmp_path, world):
    client = docker.from_env()
    async with _host(tmp_path, world, "rec", tape_mode="record", record_processes=True) as host:
        episode = await ready(host, "ep")
        recorded = [await host.step(episode_id=episode, action=a) for a in ACTIONS]
        assert recorded[1].error is None, recorded[1].error
        assert _ran(client, host, episode) == ["shell", "shell", "shell", "shell", "tool"]
        final = await host.finalize(episode_id=episode)
        recording_host = host.host_id
    tape = final.episode_dir / "tape"
    assert [e.category for e in read_entries(tape / "tape.jsonl")] == [
        "CHILD_PROCESS", "TOOL_CALL", "CHILD_PROCESS", "CHILD_PROCESS", "CHILD_PROCESS"]
    assert sorted(C.records(TapeFolder(tape))) == [0, 1, 2] and not TapeFolder(tape).verify()
    costs = [(s.diagnostics["change_set_ms"], s.diagnostics["change_set_bytes"]) for s in recorded
             if "change_set_ms" in s.diagnostics]
    assert len(costs) == 3
    print("change set cost per recorded step (ms, bytes):", costs)

    async with _host(tmp_path, world, "rep", tape_mode="replay", tape=tape) as host:
        episode = await ready(host, "ep")
        replayed = [await host.step(episode_id=episode, action=a) for a in ACTIONS]
        assert _ran(client, host, episode) == []  # not a command, not the tool
        listing = await host.step(episode_id=episode, action=tool("fs.list", path="."))
        final2 = await host.finalize(episode_id=episode)
        replaying_host = host.host_id
    for old, new in zip(recorded, replayed, strict=True):
        assert (new.observation, new.error) == (old.observation, old.error)
        assert new.diagnostics["workspace_digest"] == old.diagnostics["workspace_digest"]
    assert {e["name"] for e in listing.observation} == {"keep.txt", "link", "notes.md", "out"}
    assert final2.workspace_digest == final.workspace_digest
    report = ClosureReport.model_validate_json(final2.closure_report_path.read_text())
    assert report.run_level == "recorded_external"
    assert {(d.category, d.provider, d.note) for d in report.dependencies} == {
        ("FILESYSTEM", "seeded", None), ("CHILD_PROCESS", "recorded", None), ("TOOL_CALL", "recorded", None)}
    for host_id in (recording_host, replaying_host):
        assert client.containers.list(all=True, filters={"label": f"{L.HOST}={host_id}"}) == []
    client.close()


async def test_a_forged_change_set_is_refused_and_the_workspace_is_unchanged(tmp_path, world):
    client = docker.from_env()
    steps = [tool("shell.exec", command="ln -s /tmp planted"), tool("shell.exec", command="printf x > a.txt")]
    async with _host(tmp_path, world, "rec", tape_mode="record", record_processes=True) as host:
        episode = await ready(host, "ep")
        recorded = [await host.step(episode_id=episode, action=a) for a in steps]
        final = await host.finalize(episode_id=episode)
    tape = TapeFolder(final.episode_dir / "tape")
    forgeries = {
        "dotdot": [C.ChangeEntry(path="../etc/pwned", kind="file", mode=0o644, data="cHdu")],
        "link in the set": [C.ChangeEntry(path="out", kind="symlink", target="/tmp"),
                            C.ChangeEntry(path="out/pwned", kind="file", mode=0o644, data="cHdu")],
        "link in the workspace": [C.ChangeEntry(path="planted/pwned", kind="file", mode=0o644, data="cHdu")],
    }
    for number, (name, entries) in enumerate(forgeries.items()):
        _forge(tape, 1, entries)
        async with _host(tmp_path, world, f"rep-{number}", tape_mode="replay", tape=tape.root) as host:
            episode = await ready(host, "ep")
            first = await host.step(episode_id=episode, action=steps[0])
            second = await host.step(episode_id=episode, action=steps[1])
            container = client.containers.get(host.runtime_of(episode_id=episode).sandbox_id)
            found = container.exec_run(["sh", "-c", "for p in /etc/pwned /tmp/pwned /workspace/out /workspace/a.txt; "
                                                    "do [ -e \"$p\" ] && echo \"$p\"; done; true"]).output.decode()
            rescanned = await host.finalize(episode_id=episode)
        assert first.error is None, name
        assert second.error is not None and second.error.type == "change_set_refused", name
        assert second.diagnostics["workspace_digest"] == recorded[0].diagnostics["workspace_digest"], name
        assert rescanned.workspace_digest == recorded[0].diagnostics["workspace_digest"], name
        assert found == "", (name, found)
        report = ClosureReport.model_validate_json(rescanned.closure_report_path.read_text())
        assert report.dependencies[-1].note == "change_set_refused", name
    client.close()


async def test_a_fork_over_process_entries_is_deterministic_and_runs_nothing(tmp_path, world):
    client = docker.from_env()
    async with _host(tmp_path, world, "rec", tape_mode="record", record_processes=True) as host:
        parent = await ready(host, "p")
        recorded = [await host.step(episode_id=parent, action=a) for a in ACTIONS[:3]]
        forks = [await host.fork(episode_id=parent, path="prefix_reexecution", prefix_length=3) for _ in range(2)]
        for fork in forks:
            assert fork.lineage.workspace_digest == recorded[2].diagnostics["workspace_digest"]
            assert _ran(client, host, fork.episode_id) == []  # the prefix was served, not run
            steps = host.trajectory(episode_id=fork.episode_id)
            assert [s.observation for s in steps] == [s.observation for s in recorded]
        for fork in forks:
            await host.finalize(episode_id=fork.episode_id)
        await host.finalize(episode_id=parent)
    client.close()
