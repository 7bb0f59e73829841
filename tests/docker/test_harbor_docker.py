"""Harbor task folders as episodes on the real engine: built offline, the agent's actions, the
verifier's reward; checkpoints and both fork paths give a child the parent's reward for the same
actions; the verifier's files and reward cannot be planted by the agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ALL_CAPS, NullSubject, host_objects, tool

from softprobe.gym import create_host_environment
from softprobe.gym.cli.main import main
from softprobe.gym.errors import ConfigurationError
from softprobe.gym.harbor.agents import OracleAgent
from softprobe.gym.harbor.host import prepare_task

TASKS = Path(__file__).resolve().parents[1] / "data" / "harbor"
TERMINATE = {"type": "terminate"}


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict]]:
    code = main(["harbor", *args, "--json"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    return code, lines


def test_harbor_run_gives_oracle_one_and_nop_zero_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tasks = [str(TASKS / name) for name in ("hello-world", "hello-user", "hello-workdir", "hello-metrics")]
    code, oracle = _cli(capsys, "run", *tasks, "--agent", "oracle", "-n", "2", "--run-root", str(tmp_path / "o"))
    assert code == 0, oracle
    assert [(r["task"], r["status"], r["reward"]) for r in oracle] == [
        ("softprobe/hello-world", "succeeded", 1.0), ("softprobe/hello-user", "succeeded", 1.0),
        ("softprobe/hello-workdir", "succeeded", 1.0), ("hello-metrics", "succeeded", 1.0)]
    assert oracle[3]["metrics"] == {"reward": 1.0, "answer": 1.0, "notes": 1.0}
    world = oracle[0]
    assert world["internet"] == "declared" and world["hermetic"] is False
    assert {s["original"] for s in world["substitutions"]} >= {"FROM ubuntu:24.04", "apt-get install -y curl"}
    assert oracle[1]["hermetic"] is True
    result = json.loads((Path(world["episode_dir"]) / "result.json").read_text())
    assert result["verifier"]["reward"] == 1.0 and result["world_source"]["kind"] == "harbor_task"
    assert "2 passed" in (Path(world["episode_dir"]) / "verifier" / "test-stdout.txt").read_text()
    code, nop = _cli(capsys, "run", *tasks, "--agent", "nop", "-n", "2", "--run-root", str(tmp_path / "n"))
    assert code == 0 and [r["reward"] for r in nop] == [0.0, 0.0, 0.0, 0.0], nop
    # Any policy of the project, named MODULE:CLASS: it gets the instruction first.
    code, own = _cli(capsys, "run", tasks[0], "--agent", f"{__name__}:GreetingPolicy", "--run-root", str(tmp_path / "p"))
    assert code == 0 and own[0]["reward"] == 1.0, own


class GreetingPolicy:
    """Reads the instruction, writes the file it asks for, then stops (the runner terminates)."""

    def __init__(self, task: object) -> None:
        self.done = False

    def __call__(self, observation: dict, last: object) -> dict | None:
        if self.done:
            return None
        assert "Hello, world!" in observation["instruction"]
        self.done = True
        return tool("fs.write", path="hello.txt", content="Hello, world!\n")


def test_a_verifier_timeout_or_a_task_needing_the_internet_is_no_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, runs = _cli(capsys, "run", str(TASKS / "verifier-timeout"), str(TASKS / "needs-internet"),
                      "--agent", "nop", "--run-root", str(tmp_path))
    assert code == 1
    assert [(r["status"], r["reward"]) for r in runs] == [("timed_out", None), ("needs_internet", None)]
    assert "example.com" in runs[1]["detail"] and runs[1]["episode_dir"] is None  # never started


def test_harbor_check_says_which_tasks_are_not_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = ("hello-healthcheck", "hello-uv", "hello-multi-step", "verifier-timeout")
    code, rows = _cli(capsys, "check", *(str(TASKS / name) for name in names), "--run-root", str(tmp_path))
    assert code == 1
    assert [(r["task"], r["valid"]) for r in rows] == [
        ("softprobe/hello-healthcheck", True), ("softprobe/hello-uv", True), ("softprobe/hello-multi-step", True),
        ("verifier-timeout", False)]


@pytest.mark.parametrize(("name", "passing"), [
    ("hello-healthcheck", "test -s /app/config.ini"),
    ("hello-multi-step", "test -d /app"),  # once, before the first step
])
def test_a_failing_healthcheck_stops_the_task_before_the_agent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, passing: str) -> None:
    import shutil

    task = tmp_path / "unhealthy"
    shutil.copytree(TASKS / name, task)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace(passing, "test -s /app/missing.ini"))
    code, runs = _cli(capsys, "run", str(task), "--run-root", str(tmp_path / "run"))
    assert code == 1 and runs[0]["status"] == "unhealthy" and "3 times" in runs[0]["detail"]
    assert runs[0]["reward"] is None


def test_a_task_under_gvisor(tmp_path: Path, capsys: pytest.CaptureFixture[str], episode_runtime: str) -> None:
    """The same task, the same verdicts, with the engine's runtime and under runsc."""
    code, runs = _cli(capsys, "run", str(TASKS / "hello-user"), "--agent", "oracle", "--run-root", str(tmp_path))
    assert code == 0 and runs[0]["reward"] == 1.0


async def _oracle_actions(host, episode_id: str, task_path: Path) -> list[dict]:  # type: ignore[no-untyped-def]
    agent = OracleAgent(prepare_task(task_path).task)
    agent.begin_rollout(host, episode_id)
    actions = []
    while (action := agent(None, None)) is not None:
        actions.append(action)
    return actions


async def test_checkpoint_and_both_forks_give_the_child_the_parents_reward(tmp_path: Path) -> None:
    host = create_host_environment(run_root=tmp_path, harbor_task=TASKS / "hello-world", capabilities=ALL_CAPS,
                                   subject=NullSubject())
    try:
        await host.create_episode(episode_id="parent")
        reset = await host.reset(episode_id="parent")
        assert "hello.txt" in reset.observation["instruction"]
        start = await host.checkpoint(episode_id="parent")  # nothing done yet
        actions = await _oracle_actions(host, "parent", TASKS / "hello-world")
        for action in actions:
            step = await host.step(episode_id="parent", action=action)
            assert step.error is None, step
        solved = await host.checkpoint(episode_id="parent")
        parent = await host.step(episode_id="parent", action=TERMINATE)
        assert parent.reward == 1.0 and parent.diagnostics["verifier"]["status"] == "succeeded"

        from_checkpoint = await host.fork(episode_id="parent", path="checkpoint_import",
                                          checkpoint_id=solved.checkpoint_id)
        child = await host.step(episode_id=from_checkpoint.episode_id, action=TERMINATE)
        assert child.reward == parent.reward == 1.0

        replayed = await host.fork(episode_id="parent", path="prefix_reexecution", prefix_length=len(actions))
        child = await host.step(episode_id=replayed.episode_id, action=TERMINATE)
        assert child.reward == 1.0

        # The whole trajectory, terminate included: the child's own verifier runs on the replay.
        whole = await host.fork(episode_id="parent", path="prefix_reexecution", prefix_length=len(actions) + 1)
        assert host.trajectory(episode_id=whole.episode_id)[-1].reward == 1.0

        # Before any action the verdict is 0, in a fork as in the parent's world at that point.
        unsolved = await host.fork(episode_id="parent", path="checkpoint_import", checkpoint_id=start.checkpoint_id)
        child = await host.step(episode_id=unsolved.episode_id, action=TERMINATE)
        assert child.reward == 0.0

        group = await host.fork_many(episode_id="parent", n=2, path="prefix_reexecution", prefix_length=len(actions))
        for member in group:
            assert (await host.step(episode_id=member.episode_id, action=TERMINATE)).reward == 1.0
        final = await host.finalize(episode_id="parent")
        assert final.verifier is not None and final.verifier.reward == 1.0
    finally:
        await host.close()
    assert host_objects(host) == (set(), set())


async def test_the_agent_cannot_plant_the_verifier_or_its_reward(tmp_path: Path) -> None:
    """Attack: the agent (root in a Harbor task's sandbox) looks for the tests, writes reward 1
    where the verifier's logs go and a test.sh that always passes; the verifier's own files
    replace them, and the task is unsolved: reward 0."""
    plant = ("ls /tests 2>/dev/null && echo SAW-TESTS; mkdir -p /logs/verifier /tests && "
             "echo 1 > /logs/verifier/reward.txt && printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' "
             "> /tests/test.sh && chmod +x /tests/test.sh; rm -rf /logs && ln -s /workspace /logs; echo planted")
    async with create_host_environment(run_root=tmp_path, harbor_task=TASKS / "hello-world") as host:
        await host.create_episode(episode_id="ep")
        await host.reset(episode_id="ep")
        planted = await host.step(episode_id="ep", action=tool("shell.exec", command=plant))
        assert "planted" in planted.observation and "SAW-TESTS" not in planted.observation
        verdict = await host.step(episode_id="ep", action=TERMINATE)
        assert verdict.diagnostics["verifier"]["status"] == "succeeded" and verdict.reward == 0.0


async def test_keywords_the_task_sets_conflict(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="image"):
        create_host_environment(run_root=tmp_path, harbor_task=TASKS / "hello-world", image="softprobe/base:latest")
    with pytest.raises(ConfigurationError, match="loosen"):
        create_host_environment(run_root=tmp_path, harbor_task=TASKS / "hello-world", container={"memory": "8g"})
    host = create_host_environment(run_root=tmp_path, harbor_task=TASKS / "hello-world", container={"memory": "1g"})
    assert host.config.container.memory == "1g" and host.config.container.user == "0"
    await host.close()


def test_the_readme_harbor_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from helpers import docs_section, python_blocks

    block = python_blocks(docs_section("harbor.md", "Harbor tasks"))[0]
    monkeypatch.chdir(TASKS.parents[2])
    exec(compile(block, "docs/harbor.md", "exec"), {"__name__": "readme_harbor"})
    out = capsys.readouterr().out
    assert "hello.txt" in out and "1.0 succeeded" in out


async def test_a_task_episode_recorded_on_a_tape_replays_to_the_same_reward(tmp_path: Path) -> None:
    """The oracle's steps recorded as CHILD_PROCESS entries; a replay serves them from the tape
    (nothing runs) and the verifier, which runs live, gives the same reward."""
    async with create_host_environment(run_root=tmp_path / "rec", harbor_task=TASKS / "hello-world",
                                       tape_mode="record", record_processes=True) as host:
        await host.create_episode(episode_id="ep")
        await host.reset(episode_id="ep")
        actions = await _oracle_actions(host, "ep", TASKS / "hello-world")
        for action in actions:
            await host.step(episode_id="ep", action=action)
        assert (await host.step(episode_id="ep", action=TERMINATE)).reward == 1.0
        await host.finalize(episode_id="ep")
    tape = tmp_path / "rec" / "episodes" / "ep" / "tape"
    async with create_host_environment(run_root=tmp_path / "rep", harbor_task=TASKS / "hello-world",
                                       tape_mode="replay", tape=tape, record_processes=True) as host:
        await host.create_episode(episode_id="ep")
        await host.reset(episode_id="ep")
        for action in actions:
            assert (await host.step(episode_id="ep", action=action)).diagnostics.get("replayed") is True
        assert (await host.step(episode_id="ep", action=TERMINATE)).reward == 1.0
        final = await host.finalize(episode_id="ep")
    report = json.loads(Path(str(final.closure_report_path)).read_text())
    assert {d["provider"] for d in report["dependencies"] if d["category"] == "CHILD_PROCESS"} == {"recorded"}


def test_separate_verifier_environments_run_in_a_fresh_container_with_only_the_artifacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task-level separate verifier reading an artifact from /tmp (a tmpfs), and a multi-step
    task whose second step's verifier is separate (its image from the step's tests/Dockerfile):
    oracle 1, nop 0; the agent's other files never reach the verifier's container (its test.sh
    checks it), each pass has its records, and no container of this process is left."""
    import os

    from helpers import owned_by_process

    tasks = [str(TASKS / name) for name in ("hello-separate-verifier", "hello-separate-steps")]
    code, oracle = _cli(capsys, "run", *tasks, "--agent", "oracle", "--run-root", str(tmp_path / "o"))
    assert code == 0 and [(r["status"], r["reward"]) for r in oracle] == [("succeeded", 1.0)] * 2, oracle
    for run in oracle:
        assert list((Path(run["episode_dir"]) / "verifier-environment").iterdir()), run
    code, nop = _cli(capsys, "run", *tasks, "--agent", "nop", "--run-root", str(tmp_path / "n"))
    assert code == 0 and [r["reward"] for r in nop] == [0.0, 0.0], nop
    assert owned_by_process(os.getpid())[0] == []
