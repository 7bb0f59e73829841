"""Run Harbor tasks as episodes with an agent and collect each one's verdict: what
``softprobe-gym harbor run`` and ``harbor check`` do.

:func:`run_task` loads a task, builds its image (offline where it must be), starts an episode,
runs the task's healthcheck, lets the agent act (within ``[agent] timeout_sec``), terminates
the episode (its verifier runs then) and finalizes it; a verifier with an environment of its
own (``[verifier] environment_mode = "separate"``, per step too) runs in a second episode
(:mod:`softprobe.gym.harbor.separate`). A task that still needs the internet is not run: it is
reported as ``needs_internet``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from softprobe.gym.errors import GymError
from softprobe.gym.harbor.agents import make_agent
from softprobe.gym.harbor.host import PreparedTask, prepare_task
from softprobe.gym.harbor.separate import run_separate_verifier, verifier_definition
from softprobe.gym.harbor.task import HarborTask, TaskStep, resolve_env
from softprobe.gym.results import EpisodeHandle, ResetResult
from softprobe.gym.verdicts import run_verifier
from softprobe.gym.verifiers import VerifierResult, VerifierSpec

#: A run's status: the verifier's, or why the task did not reach its verifier.
RunStatus = Literal["succeeded", "timed_out", "crashed", "no_reward", "invalid_reward", "invalid_task",
                    "build_failed", "needs_internet", "unhealthy", "error"]
Progress = Callable[[str, int, int], None]


class TaskRun(BaseModel):
    """One task's outcome.

    Attributes:
        task: the task's name; ``path`` its folder.
        status: the verifier's status (``succeeded``: a reward was read), or why the task did
            not reach its verifier.
        reward / metrics: the verdict (None / empty unless ``succeeded``).
        internet / hermetic: see :class:`~softprobe.gym.harbor.host.PreparedTask`.
        substitutions / warnings / internet_uses: what the run changed, honours in part, or
            still needs.
    """

    task: str
    path: str
    agent: str
    status: RunStatus
    reward: float | None = None
    metrics: dict[str, float] = {}
    detail: str = ""
    episode_dir: str | None = None
    internet: str | None = None
    hermetic: bool = False
    substitutions: list[dict[str, str]] = []
    warnings: list[dict[str, str]] = []
    internet_uses: list[str] = []
    duration_s: float = 0.0
    #: A multi-step task's steps: ``name``, ``status``, ``reward``, ``metrics`` each, in order
    #: (a step that did not meet its ``min_reward`` is the last one run).
    steps: list[dict[str, Any]] = []

    @property
    def verdict(self) -> bool:
        """Whether the task ran to a verdict (a reward of 0 is one; an error is not)."""
        return self.status == "succeeded"


def find_tasks(paths: Sequence[str | Path]) -> list[Path]:
    """The task folders ``paths`` name: each a task folder (holding ``task.toml``) or a folder
    of them (its sub-folders holding one), in name order.

    Raises:
        GymError: a path is neither.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw).expanduser().resolve()
        if (path / "task.toml").is_file():
            found.append(path)
        elif path.is_dir() and (children := sorted(p for p in path.iterdir() if (p / "task.toml").is_file())):
            found.extend(children)
        else:
            raise GymError(f"{raw} is not a Harbor task folder (no task.toml) nor a folder of them")
    return found


async def run_task(
    task: str | Path | HarborTask, *, agent: str, run_root: Path, docker_host: str | None = None,
    mode: Literal["auto", "online", "offline"] = "auto", log: Callable[[str], None] | None = None,
) -> TaskRun:
    """Run one task with ``agent`` (``oracle``, ``nop`` or ``MODULE:CLASS``); never raises for
    what the task or agent does (the status says it)."""
    from softprobe.gym.episodes.factory import create_host_environment
    from softprobe.gym.harbor.task import HarborTaskError, load_harbor_task

    started = time.perf_counter()
    path = str(task.root if isinstance(task, HarborTask) else task)
    name = task.name if isinstance(task, HarborTask) else Path(path).name
    try:
        loaded = task if isinstance(task, HarborTask) else load_harbor_task(task)
    except HarborTaskError as err:
        return TaskRun(task=name, path=path, agent=agent, status="invalid_task", detail=str(err))
    try:
        prepared = await asyncio.to_thread(prepare_task, loaded, docker_host=docker_host, mode=mode, log=log)
    except GymError as err:
        return TaskRun(task=loaded.name, path=path, agent=agent, status="build_failed", detail=str(err),
                       warnings=[w.model_dump() for w in loaded.warnings])
    base = _base(prepared, agent)
    if prepared.internet == "needed":
        return TaskRun(**base, status="needs_internet",
                       detail="still fetches from the internet at run time: " + "; ".join(prepared.image.internet_uses))
    if loaded.steps:
        return await _run_steps(prepared, agent, run_root, docker_host, base, started, mode)
    if verifier_definition(loaded) is not None:
        return await _run_separate(prepared, agent, run_root, docker_host, base, started, mode)
    try:
        policy = make_agent(agent, loaded)
        host = create_host_environment(run_root=run_root, harbor_task=prepared, docker_host=docker_host)
    except GymError as err:
        return TaskRun(**base, status="error", detail=str(err))
    try:
        begun = await _start_task_episode(host, loaded, base, started)
        if isinstance(begun, TaskRun):
            return begun
        handle, reset = begun
        episode_id = handle.episode_id
        await drive(host, episode_id, policy, reset.observation, loaded.agent_timeout_s)
        final = await host.finalize(episode_id=episode_id)
        verdict = final.verifier
        assert verdict is not None  # a task's host always has a verifier
        return TaskRun(**base, status=verdict.status, reward=verdict.reward, metrics=verdict.metrics,
                       detail=verdict.detail, episode_dir=str(final.episode_dir), duration_s=_since(started))
    except GymError as err:
        return TaskRun(**base, status="error", detail=f"{type(err).__name__}: {err}", duration_s=_since(started))
    finally:
        await host.close()


async def drive(host: Any, episode_id: str, policy: Any, observation: Any, timeout_s: float | None,
                *, terminate: bool = True) -> bool:
    """Step ``episode_id`` with ``policy`` until it stops (None), the episode ends, or
    ``timeout_s`` has passed; then terminate it if it is not over (its verifier runs then) when
    ``terminate``. Returns whether the episode is over."""
    import inspect

    from softprobe.gym.training.session import PolicyStep

    started = time.monotonic()
    begun = getattr(policy, "begin_rollout", None)
    if callable(begun):
        outcome = begun(host, episode_id)
        if inspect.isawaitable(outcome):
            await outcome
    last = None
    output: str | None = None
    while timeout_s is None or time.monotonic() - started < timeout_s:
        chosen = policy(observation, last)
        if inspect.isawaitable(chosen):
            chosen = await chosen
        if chosen is None:
            break
        refused = None
        if isinstance(chosen, PolicyStep):
            chosen, refused = chosen.action, chosen.refused
        last = await host.step(episode_id=episode_id, action=chosen, refused=refused) if refused is not None \
            else await host.step(episode_id=episode_id, action=chosen)
        observation = last.observation
        if last.terminated or last.truncated:
            return True
    else:
        output = f"the agent's time ({timeout_s:g}s, [agent] timeout_sec) ran out"
    if terminate:
        await host.step(episode_id=episode_id, action={"type": "terminate", "output": output})
    return terminate


async def run_tasks(
    tasks: Sequence[Path], *, agent: str, run_root: Path, concurrency: int = 1, docker_host: str | None = None,
    progress: Progress | None = None, mode: Literal["auto", "online", "offline"] = "auto",
) -> list[TaskRun]:
    """:func:`run_task` for each task, ``concurrency`` at a time; the runs in ``tasks``' order."""
    gate = asyncio.Semaphore(max(1, concurrency))
    done = 0

    async def one(path: Path) -> TaskRun:
        nonlocal done
        async with gate:
            result = await run_task(path, agent=agent, run_root=run_root, docker_host=docker_host, mode=mode)
        done += 1
        if progress is not None:
            progress(f"{result.task}: {result.status}", done, len(tasks))
        return result

    if progress is not None:
        progress("starting", 0, len(tasks))
    return list(await asyncio.gather(*(one(path) for path in tasks)))


async def _start_task_episode(host: Any, task: HarborTask, base: dict[str, Any],
                              started: float) -> tuple[EpisodeHandle, ResetResult] | TaskRun:
    """Create and reset an episode of ``task`` on ``host``, then run the task's healthcheck (if
    it has one): the episode's handle and reset, or, when the healthcheck failed, the task's
    ``unhealthy`` run (its episode destroyed)."""
    handle = await host.create_episode()
    reset = await host.reset(episode_id=handle.episode_id)
    if task.healthcheck is not None:
        problem = await _healthcheck(host, handle.episode_id, task)
        if problem is not None:
            await host.destroy(episode_id=handle.episode_id)
            return TaskRun(**base, status="unhealthy", detail=problem, episode_dir=str(handle.episode_dir),
                           duration_s=_since(started))
    return handle, reset


async def _healthcheck(host: Any, episode_id: str, task: HarborTask) -> str | None:
    """Run the task's healthcheck until it passes (None) or its retries are spent (why)."""
    check = task.healthcheck
    assert check is not None
    runtime = host.runtime_of(episode_id=episode_id)
    spec = VerifierSpec(files_dir="/logs/healthcheck-files", logs_dir="/logs/healthcheck",
                        command=("/bin/sh", "-c", check.command), timeout_s=check.timeout_s)
    started = time.monotonic()
    failures = 0
    last = ""
    while True:
        verdict = await run_verifier(runtime, spec)
        if verdict.exit_code == 0:
            return None
        last = verdict.detail or f"exit code {verdict.exit_code}: {verdict.log_tail[-300:]}"
        in_start_period = time.monotonic() - started < check.start_period_s
        failures += 0 if in_start_period else 1
        if failures >= check.retries:
            return f"the healthcheck failed {failures} times: {last}"
        await asyncio.sleep(check.interval_s)  # the task's own retry interval


async def _run_separate(prepared: PreparedTask, agent: str, run_root: Path, docker_host: str | None,
                        base: dict[str, Any], started: float, mode: Any) -> TaskRun:
    """A single-step task whose verifier has an environment of its own: the agent's episode
    (healthcheck, agent), then the verifier's (:mod:`softprobe.gym.harbor.separate`), then the
    agent's episode terminated and finalized."""
    from softprobe.gym.episodes.config import HostConfig
    from softprobe.gym.episodes.factory import open_host

    task = prepared.task
    definition = verifier_definition(task)
    assert definition is not None
    options = prepared.host_options()
    template: VerifierSpec = options.pop("verifier")
    try:
        policy = make_agent(agent, task)
        host = open_host(HostConfig.parse(run_root=run_root, docker_host=docker_host, verifier=None, **options))
    except GymError as err:
        return TaskRun(**base, status="error", detail=str(err))
    try:
        begun = await _start_task_episode(host, task, base, started)
        if isinstance(begun, TaskRun):
            return begun
        handle, reset = begun
        episode_id = handle.episode_id
        over = await drive(host, episode_id, policy, reset.observation, task.agent_timeout_s, terminate=False)
        verdict = await run_separate_verifier(
            task, definition, agent_host=host, agent_episode=episode_id, artifacts=task.artifacts,
            template=template, files_root=None, timeout_s=template.timeout_s, env=template.env,
            records=handle.episode_dir / "verifier-environment" / "task", logs=handle.episode_dir / "verifier",
            docker_host=docker_host, mode=mode)
        if not over:
            await host.step(episode_id=episode_id, action={"type": "terminate"})
        final = await host.finalize(episode_id=episode_id)
        return TaskRun(**base, status=verdict.status, reward=verdict.reward, metrics=verdict.metrics,
                       detail=verdict.detail, episode_dir=str(final.episode_dir), duration_s=_since(started))
    except GymError as err:
        return TaskRun(**base, status="error", detail=f"{type(err).__name__}: {err}", duration_s=_since(started))
    finally:
        await host.close()


async def _run_steps(prepared: PreparedTask, agent: str, run_root: Path, docker_host: str | None,
                     base: dict[str, Any], started: float, mode: Any = "auto") -> TaskRun:
    """A multi-step task in one episode, as Harbor runs it: per step, its ``workdir/`` copied into
    the workdir and its ``setup.sh`` run (episode steps, so a fork re-executes them), the agent
    on the step's instruction, then the step's verifier (the task's ``tests/`` with the step's
    over it; in a container of its own when the step's verifier is separate); a step below its
    ``min_reward`` ends the task. The reward: the steps' mean per
    metric (``mean``, a missing metric counting 0) or the last step's (``final``)."""
    from softprobe.gym.episodes.config import HostConfig
    from softprobe.gym.episodes.factory import open_host
    from softprobe.gym.harbor.agents import staging_actions, unpack_command

    task = prepared.task
    options = prepared.host_options()
    template: VerifierSpec = options.pop("verifier")
    try:
        host = open_host(HostConfig.parse(run_root=run_root, docker_host=docker_host, verifier=None, **options))
        shared = None if agent in ("oracle", "nop") else make_agent(agent, task)
    except GymError as err:
        return TaskRun(**base, status="error", detail=str(err))
    done: list[dict[str, Any]] = []
    verdicts: list[VerifierResult] = []
    try:
        # The healthcheck runs once, when the environment is up, before the first step (as Harbor's).
        begun = await _start_task_episode(host, task, base, started)
        if isinstance(begun, TaskRun):
            return begun
        handle, reset = begun
        episode_id = handle.episode_id
        over = False
        for step in task.steps:
            # The previous step's grading harness and outputs are gone before this step's agent runs
            # (an empty /logs/verifier stays: Harbor's agents see it; the verifier empties it again).
            clear = "rm -rf /tests /logs/verifier && mkdir -p -m 777 /logs/verifier"
            await host.run_process(episode_id=episode_id, argv=["/bin/sh", "-c", clear], user="root", timeout_s=60,
                                   output_cap=4096)
            if step.workdir_dir is not None:
                for action in staging_actions(step.workdir_dir):
                    await host.step(episode_id=episode_id, action=action)
                setup = unpack_command(".") + (" && bash ./setup.sh" if (step.workdir_dir / "setup.sh").is_file()
                                               else "")
                ran = await host.step(episode_id=episode_id, action={"type": "tool", "name": "shell.exec",
                                                                      "args": {"command": setup}})
                if ran.error is not None:
                    done.append({"name": step.name, "status": "crashed", "reward": None, "metrics": {},
                                 "detail": f"setup.sh failed: {ran.error.message}"})
                    break
            policy = shared if shared is not None else (
                make_agent(agent, task) if agent == "nop" else _step_oracle(task, step))
            over = await drive(host, episode_id, policy, {**reset.observation, "instruction": step.instruction},
                               step.agent_timeout_s or task.agent_timeout_s, terminate=False)
            spec = template.model_copy(update={
                "files_root": _step_tests(task, step),
                "timeout_s": step.verifier_timeout_s or template.timeout_s,
                "env": {**template.env, **resolve_env(step.verifier_env, f"steps.{step.name}.verifier.env")}})
            logs = handle.episode_dir / "verifier" / step.name
            definition = verifier_definition(task, step)
            if definition is None:
                verdict = await run_verifier(_live(host, episode_id), spec, logs_destination=logs)
            else:
                verdict = await run_separate_verifier(
                    task, definition, agent_host=host, agent_episode=episode_id,
                    artifacts=(*task.artifacts, *step.artifacts), template=spec, files_root=spec.files_root,
                    timeout_s=spec.timeout_s, env=spec.env, records=handle.episode_dir / "verifier-environment" /
                    step.name, logs=logs, docker_host=docker_host, mode=mode)
            verdicts.append(verdict)
            done.append({"name": step.name, "status": verdict.status, "reward": verdict.reward,
                         "metrics": verdict.metrics, "detail": verdict.detail})
            if over or not _meets(step.min_reward, verdict):
                break
        if not over:
            await host.step(episode_id=episode_id, action={"type": "terminate"})
        final = await host.finalize(episode_id=episode_id)
    except GymError as err:
        return TaskRun(**base, status="error", detail=f"{type(err).__name__}: {err}", steps=done,
                       duration_s=_since(started))
    finally:
        await host.close()
    failed = next((d for d in done if d["status"] != "succeeded"), None)
    if failed is not None:
        return TaskRun(**base, status=failed["status"], detail=f"step {failed['name']}: {failed['detail']}",
                       steps=done, episode_dir=str(final.episode_dir), duration_s=_since(started))
    metrics = _aggregate(task.multi_step_reward_strategy, [v.metrics for v in verdicts])
    reward = metrics.get("reward", sum(metrics.values()) / len(metrics) if metrics else None)
    return TaskRun(**base, status="succeeded", reward=reward, metrics=metrics, steps=done,
                   episode_dir=str(final.episode_dir), duration_s=_since(started))


def _live(host: Any, episode_id: str) -> Any:
    runtime = host.runtime_of(episode_id=episode_id)
    if runtime is None:
        raise GymError(f"episode {episode_id} has no sandbox any more")
    return runtime


def _step_oracle(task: HarborTask, step: TaskStep) -> Any:
    from softprobe.gym.harbor.agents import OracleAgent

    return OracleAgent(task, solution_dir=step.solution_dir, timeout_s=step.agent_timeout_s)


def _step_tests(task: HarborTask, step: TaskStep) -> Path:
    """The task's ``tests/`` with the step's over it (its ``test.sh`` wins), in the cache."""
    import hashlib
    import shutil

    from softprobe.gym.providers.docker.harbor_image import cache_dir

    key = hashlib.sha256(f"{task.digest}/{step.name}/executable".encode()).hexdigest()[:24]
    folder = cache_dir() / "step-tests" / key / "tests"
    if not (folder.parent / ".complete").is_file():
        shutil.rmtree(folder.parent, ignore_errors=True)
        folder.mkdir(parents=True)
        for source in (task.tests_dir, step.tests_dir):
            if source is not None and source.is_dir():
                shutil.copytree(source, folder, dirs_exist_ok=True)
        if (folder / "test.sh").is_file():
            (folder / "test.sh").chmod(0o755)  # Harbor makes it executable (tasks often ship it 0644)
        (folder.parent / ".complete").write_text("")
    return folder


def _meets(minimum: float | dict[str, float] | None, verdict: VerifierResult) -> bool:
    if minimum is None:
        return True
    if verdict.status != "succeeded":
        return False
    wanted = {"reward": minimum} if isinstance(minimum, float) else minimum
    return all(verdict.metrics.get(key, float("-inf")) >= value for key, value in wanted.items())


def _aggregate(strategy: str, results: list[dict[str, float]]) -> dict[str, float]:
    if not results:
        return {}
    if strategy == "final":
        return dict(results[-1])
    keys = sorted({key for metrics in results for key in metrics})
    return {key: sum(metrics.get(key, 0.0) for metrics in results) / len(results) for key in keys}


def _base(prepared: PreparedTask, agent: str) -> dict[str, Any]:
    return {"task": prepared.task.name, "path": str(prepared.task.root), "agent": agent,
            "internet": prepared.internet, "hermetic": prepared.hermetic,
            "substitutions": [s.model_dump() for s in prepared.image.substitutions],
            "warnings": [w.model_dump() for w in prepared.warnings],
            "internet_uses": list(prepared.image.internet_uses)}


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)


__all__ = ["RunStatus", "TaskRun", "drive", "find_tasks", "run_task", "run_tasks"]
