"""The host episode API: create, reset, step, checkpoint, finalize and destroy episodes.

Each episode runs in its own container started from the seed image; its tools run through the
shim inside it. The host owns every episode's state machine and its folder under ``run_root``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable

from softprobe.gym import labels as L
from softprobe.gym.actions import TerminateAction, ToolAction, parse_action
from softprobe.gym.episodes.store import EpisodeStore, validate_episode_id
from softprobe.gym.errors import (
    CapabilityError,
    ConfigurationError,
    EpisodeBrokenError,
    EpisodeExistsError,
    EpisodeNotFoundError,
    ForkRequestError,
    GymError,
    ForkVerificationError,
    LifecycleError,
    OnStepHookError,
    ReplayDivergenceError,
    SandboxError,
    SandboxLostError,
    SubjectStateError,
)
from softprobe.gym.episodes.fork import ForkLineage, ForkPath, ForkResult, check_fork_path, check_prefix_length
from softprobe.gym.episodes.hooks import OnStepHook, StepContext, call_hook
from softprobe.gym.episodes.config import HostOptions
from softprobe.gym.episodes.lifecycle import require
from softprobe.gym.episodes.pool import WarmPool
from softprobe.gym.results import (
    CheckpointRecord,
    EpisodeHandle,
    EpisodeState,
    FinalizeResult,
    ResetResult,
    StepError,
    StepResult,
)
from softprobe.gym.providers.base import Sandbox, SandboxBackend, SandboxSpec
from softprobe.gym.settings import Capabilities, ContainerSettings

DEFAULT_IMAGE = "softprobe/base:latest"
#: Default of ``artifact_budget_bytes``: the most file data finalize copies out of a workspace.
DEFAULT_ARTIFACT_BUDGET_BYTES = 2 * 1024**3
#: Default of ``checkpoint_budget_bytes``: the most filesystem changes a checkpoint commits.
DEFAULT_CHECKPOINT_BUDGET_BYTES = 2 * 1024**3


@dataclass
class _Episode:
    """The host's private record of one episode."""

    episode_id: str
    store: EpisodeStore
    state: EpisodeState = EpisodeState.CREATED
    sandbox: Sandbox | None = None
    steps: list[StepResult] = field(default_factory=list)
    initial_digest: str = ""  # the world right after the last reset
    workspace_digest: str = ""
    broken: str | None = None
    checkpoints: list[str] = field(default_factory=list)  # made from this episode
    holds_slot: bool = False  # counts against max_containers
    source_checkpoint: str | None = None  # the checkpoint its container was started from
    lineage: ForkLineage | None = None
    max_steps: int | None = None  # overrides the host's limit
    seed_root: Path | None = None  # overrides the host's seed_root
    # Names this attempt (renewed by every reset): in result.json and on every trajectory line.
    source_trace_id: str = field(default_factory=lambda: secrets.token_hex(16))
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class _Checkpoint:
    """A checkpoint's record, the trajectory it was taken at, and who still needs its image."""

    record: CheckpointRecord
    steps: list[StepResult]
    initial_digest: str
    users: set[str] = field(default_factory=set)  # episodes whose container runs from it
    released: bool = False  # its episode was destroyed: no new fork can name it


class HostEnvironment:
    """Runs episodes, each in its own container. Create it with :func:`create_host_environment`.

    Lifecycle of an episode: ``created -> ready -> running -> terminated -> finalized ->
    destroyed``. A call out of order raises :class:`LifecycleError` and changes nothing.
    All methods are coroutines and take keyword arguments only. Calls on one episode are
    served one at a time; calls on different episodes run concurrently.

    Use it as ``async with create_host_environment(...) as host:`` or call :meth:`close`.
    """

    def __init__(
        self,
        *,
        run_root: Path,
        seed_root: Path | None,
        image: str,
        capabilities: Capabilities,
        on_step: OnStepHook | None,
        subject: Any,
        container: ContainerSettings,
        tool_timeout_s: float,
        max_tool_timeout_s: float,
        output_cap_bytes: int,
        max_steps: int | None,
        backend: SandboxBackend,
        sweep_on_start: bool,
        pool_size: int = 0,
        max_containers: int | None = None,
        workspace_tracking: str = "inotify",
        artifact_budget_bytes: int | None = None,
        checkpoint_budget_bytes: int | None = None,
    ) -> None:
        self.run_root = run_root
        self.seed_root = seed_root
        self.image = image
        self.capabilities = capabilities
        self.container_settings = container
        self.tool_timeout_s = tool_timeout_s
        self.max_tool_timeout_s = max_tool_timeout_s
        self.output_cap_bytes = output_cap_bytes
        self.max_steps = max_steps
        self.artifact_budget_bytes = artifact_budget_bytes
        self.checkpoint_budget_bytes = checkpoint_budget_bytes
        self.host_id = uuid.uuid4().hex[:16]
        self._on_step = on_step
        self._subject = subject
        self._backend = backend
        self._episodes: dict[str, _Episode] = {}
        self._checkpoints: dict[str, _Checkpoint] = {}
        self._sweep_pending = sweep_on_start
        self.workspace_tracking = workspace_tracking
        self.max_containers = max_containers
        # Episodes holding a container, at most max_containers at once (the pool is extra).
        self._slots = asyncio.Semaphore(max_containers) if max_containers else None
        self.pool: WarmPool | None = None
        if pool_size > 0:
            pool_spec = self._spec(labels=self._labels("") | {L.POOL: "true"}, seed=False)
            self.pool = WarmPool(backend, pool_spec, pool_size)
        self._sweep_lock = asyncio.Lock()
        self._collect_lock = asyncio.Lock()  # concurrent destroys must not race over images
        self._retiring: set[asyncio.Future[None]] = set()  # containers being removed in the background
        self._closed = False

    # -- context manager -----------------------------------------------------------------------

    async def __aenter__(self) -> HostEnvironment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- queries -------------------------------------------------------------------------------

    def state(self, *, episode_id: str) -> EpisodeState:
        """The episode's lifecycle state. Raises EpisodeNotFoundError."""
        return self._get(episode_id).state

    def trajectory(self, *, episode_id: str) -> list[StepResult]:
        """The steps taken since the episode's last reset."""
        return list(self._get(episode_id).steps)

    # -- lifecycle -----------------------------------------------------------------------------

    async def create_episode(
        self,
        *,
        episode_id: str | None = None,
        max_steps: int | None = None,
        seed_root: str | Path | None = None,
    ) -> EpisodeHandle:
        """Reserve an episode id and its folder ``run_root/episodes/<episode_id>``.

        No container is started until :meth:`reset`.

        Args:
            episode_id: 1-128 letters, digits, ``.``, ``_`` or ``-``; generated if omitted.
            max_steps: this episode's step limit (default: the host's ``max_steps``).
            seed_root: this episode's seed folder (default: the host's ``seed_root``).

        Raises:
            ConfigurationError: the id is not of that form.
            EpisodeExistsError: this host already has an episode with that id, or its folder
                already holds records (an earlier run, or another host on the same
                ``run_root``); nothing in that folder is changed.
        """
        self._check_open()
        episode_id = validate_episode_id(
            f"ep-{uuid.uuid4().hex[:12]}" if episode_id is None else episode_id
        )
        if episode_id in self._episodes:
            raise EpisodeExistsError(
                f"episode {episode_id!r} already exists on this host; pick another id or "
                "destroy it first"
            )
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ConfigurationError(f"max_steps must be a positive int, not {max_steps!r}")
        seed = None
        if seed_root is not None:
            seed = Path(seed_root).expanduser().resolve()
            if not seed.is_dir():
                raise ConfigurationError(f"seed_root {seed} is not a directory")
        episode = _Episode(episode_id, EpisodeStore(self.run_root, episode_id), max_steps=max_steps, seed_root=seed)
        episode.store.create(self._record(episode))  # claims the folder, or EpisodeExistsError
        self._episodes[episode_id] = episode
        return EpisodeHandle(
            episode_id=episode_id, state=episode.state, episode_dir=episode.store.dir
        )

    async def reset(self, *, episode_id: str) -> ResetResult:
        """Start the episode from the seed in a fresh container and return the first observation.

        The container is started from ``image``; ``seed_root`` is copied into ``/workspace``. On
        an episode that already ran, the old container is removed first and the action log
        starts over: nothing of the previous attempt carries into the new one.

        Raises:
            LifecycleError: the episode is finalized or destroyed.
            ImageNotFoundError: the seed image is not on the engine.
            SandboxStartError / SandboxError: the container could not be started.
        """
        episode = self._get(episode_id)
        require(episode_id, episode.state, "reset")
        await self._sweep_once()
        async with episode.lock:
            require(episode_id, episode.state, "reset")
            started = time.perf_counter()
            # The old container goes in the background: nothing waits for its removal.
            await self._drop_sandbox(episode, background=True)
            await self._hold_slot(episode)
            try:
                self._require_not_destroyed(episode, "reset")  # destroyed while it waited
                sandbox = await self._start_for(episode_id, episode.seed_root or self.seed_root)
            except BaseException:
                self._release_slot(episode)
                raise
            if episode.state is EpisodeState.DESTROYED:  # destroyed while the container started
                await sandbox.remove()
                self._release_slot(episode)
                self._require_not_destroyed(episode, "reset")
            episode.sandbox = sandbox
            episode.steps = []
            episode.broken = None
            episode.source_trace_id = secrets.token_hex(16)
            episode.initial_digest = sandbox.hello.workspace_digest
            episode.workspace_digest = sandbox.hello.workspace_digest
            episode.state = EpisodeState.READY
            episode.store.start_trajectory()
            episode.store.write_record(self._record(episode))
            hello = sandbox.hello
            return ResetResult(
                episode_id=episode_id,
                observation={
                    "tools": [tool.name for tool in hello.tools],
                    "workspace_files": hello.workspace_files,
                },
                diagnostics={
                    "workspace_digest": hello.workspace_digest,
                    "changed_paths": [],
                    "image_id": sandbox.image_id,
                    "shim_version": hello.shim_version,
                },
                tools=hello.tools,
                source_trace_id=episode.source_trace_id,
                duration_ms=_ms_since(started),
            )

    async def step(self, *, episode_id: str, action: object) -> StepResult:
        """Apply one action and return what the agent observes.

        ``action`` is ``{"type": "tool", "name": ..., "args": {...}}`` or
        ``{"type": "terminate", "output": ...}`` (a dict or a model). It is validated before
        anything runs.

        What the agent gets wrong is not an exception: an unknown tool, bad arguments, a path
        outside the workspace, a timeout, a failing command or one that runs out of memory all
        return a StepResult whose ``error`` says what happened, and the episode goes on.
        ``terminated`` is True after a ``terminate`` action; ``truncated`` is True when the step
        reached ``max_steps``. Either ends the episode (state ``terminated``). Actions are never
        retried: a tool may have had effects.

        Raises:
            InvalidActionError: ``action`` is not an action (the episode is unchanged).
            LifecycleError: the episode is not ``ready`` or ``running``, or it was destroyed
                while the step ran (the step is then not recorded; it stays destroyed).
            EpisodeBrokenError: the container or shim died or hung; ``reset`` or ``destroy`` it.
            ShimReplyError: the shim's reply could not be read; the step is not recorded, the
                episode is not broken (the tool may have had effects).
            OnStepHookError: the ``on_step`` hook raised (the step ran and is recorded).
        """
        return await self._step(episode_id, action, score=None)

    async def _step(
        self, episode_id: str, action: object, *, score: Callable[[StepResult], Awaitable[None]] | None
    ) -> StepResult:
        """:meth:`step`, with ``score(result)`` (a training session's rewards) run before the
        step's line is written, so ``trajectory.jsonl`` holds each step whole as it completes.
        ``score`` is skipped when the hook raised; a GymError it raises (RewardError) is raised
        after the step is recorded."""
        episode = self._get(episode_id)
        self._require_usable(episode, "step")
        parsed = parse_action(action)
        async with episode.lock:
            self._require_usable(episode, "step")
            sandbox = episode.sandbox
            assert sandbox is not None
            started = time.perf_counter()
            index = len(episode.steps) + 1
            if isinstance(parsed, TerminateAction):
                observation: Any = parsed.output if parsed.output is not None else ""
                error: StepError | None = None
                diagnostics: dict[str, Any] = {
                    "workspace_digest": episode.workspace_digest,
                    "changed_paths": [],
                }
            else:
                call = await self._call_tool(episode, sandbox, parsed)
                self._require_not_destroyed(episode, "step")
                observation, error, diagnostics = call.observation, call.error, call.diagnostics
                episode.workspace_digest = diagnostics["workspace_digest"]
            terminated = isinstance(parsed, TerminateAction)
            limit = episode.max_steps if episode.max_steps is not None else self.max_steps
            truncated = not terminated and limit is not None and index >= limit
            result = StepResult(
                episode_id=episode_id,
                index=index,
                action=parsed,
                observation=observation,
                terminated=terminated,
                truncated=truncated,
                diagnostics=diagnostics,
                error=error,
                source_trace_id=episode.source_trace_id,
            )
            hook_error = await self._run_hook(episode, sandbox, parsed, result)
            self._require_not_destroyed(episode, "step")
            score_error: GymError | None = None
            if score is not None and hook_error is None:
                try:
                    await score(result)
                except GymError as err:
                    score_error = err
                self._require_not_destroyed(episode, "step")
            result.duration_ms = _ms_since(started)
            episode.steps.append(result)
            episode.store.append_step(result)
            episode.state = (
                EpisodeState.TERMINATED if terminated or truncated else EpisodeState.RUNNING
            )
        if hook_error is not None:
            raise OnStepHookError(
                f"on_step raised {type(hook_error).__name__}: {hook_error} (step {index} of "
                f"{episode_id!r} ran and is recorded; see .step_result)",
                result,
            ) from hook_error
        if score_error is not None:
            raise score_error
        return result

    async def checkpoint(self, *, episode_id: str) -> CheckpointRecord:
        """Snapshot the episode's container filesystem (``docker commit``) for a later fork.

        Needs the ``environment_checkpoint`` capability. Captures the filesystem (workspace
        included), not process memory, volumes or tmpfs mounts. At most
        ``checkpoint_budget_bytes`` of filesystem changes are committed.

        Raises:
            CapabilityError: ``environment_checkpoint`` was not declared (nothing is committed).
            CheckpointTooLargeError: the changes exceed ``checkpoint_budget_bytes`` (nothing is
                committed; the episode goes on).
            LifecycleError / EpisodeBrokenError: the episode has no live container.
            SubjectStateError: ``subject.export_state`` raised (nothing is committed).
        """
        episode = self._get(episode_id)
        if not self.capabilities.environment_checkpoint:
            raise CapabilityError(
                "checkpoint needs the environment_checkpoint capability; declare it with "
                "create_host_environment(capabilities={'environment_checkpoint': True, ...})"
            )
        self._require_usable(episode, "checkpoint")
        async with episode.lock:
            self._require_usable(episode, "checkpoint")
            assert episode.sandbox is not None
            checkpoint_id = f"ckpt-{uuid.uuid4().hex[:16]}"
            labels = self._labels(episode_id) | {L.CHECKPOINT: checkpoint_id}
            # The subject first: if it fails, there is no image to clean up.
            subject_state = None
            if self._subject is not None:
                try:
                    subject_state = await _maybe_await(self._subject.export_state(episode_id))
                except Exception as err:
                    raise SubjectStateError(
                        f"checkpoint of {episode_id!r}: subject.export_state raised "
                        f"{type(err).__name__}: {err}. Nothing was committed; the episode goes on "
                        "unchanged. Fix the subject adapter, then checkpoint again."
                    ) from err
                self._require_not_destroyed(episode, "checkpoint")
            try:
                # What is committed is described by a digest taken now, after a sweep, not by
                # the last step's (incremental) one.
                workspace_digest = await episode.sandbox.rescan()
                image_id = await episode.sandbox.commit(labels=labels, max_bytes=self.checkpoint_budget_bytes)
            except SandboxLostError as err:
                self._require_not_destroyed(episode, "checkpoint")
                raise await self._broken(episode, str(err)) from err
            except Exception:
                self._require_not_destroyed(episode, "checkpoint")  # it failed *because* of that
                raise
            try:
                self._require_not_destroyed(episode, "checkpoint")
            except BaseException:
                # Nobody will ever own this image: remove it rather than leak it.
                await asyncio.shield(self._backend.remove_image(image_id))
                raise
            episode.workspace_digest = workspace_digest
            record = CheckpointRecord(
                checkpoint_id=checkpoint_id,
                episode_id=episode_id,
                step_index=len(episode.steps),
                image_id=image_id,
                workspace_digest=episode.workspace_digest,
                subject_state=subject_state,
                created_at=datetime.now(timezone.utc),
            )
            self._checkpoints[checkpoint_id] = _Checkpoint(
                record, list(episode.steps), episode.initial_digest
            )
            episode.checkpoints.append(checkpoint_id)
            folder = episode.store.dir / "checkpoints"
            folder.mkdir(exist_ok=True)
            (folder / f"{checkpoint_id}.json").write_text(record.model_dump_json(indent=2))
            return record

    async def fork(
        self,
        *,
        episode_id: str,
        path: str,
        checkpoint_id: str | None = None,
        prefix_length: int | None = None,
        child_episode_id: str | None = None,
        strict: bool = False,
    ) -> ForkResult:
        """Branch a new episode off this one. Exactly two paths are legal.

        ``path="checkpoint_import"`` (needs ``environment_checkpoint`` and
        ``subject_state_import``): the child's container starts from the checkpoint's image and
        the subject's ``import_state(child_id, state)`` gets the state saved with it. The child
        is ready to step from the checkpoint's step; no action is re-run. Its world is verified
        to have the checkpoint's ``workspace_digest``.

        ``path="prefix_reexecution"`` (needs ``deterministic_prefix_reexecution``): the child
        starts from the parent's seed (its own ``seed_root`` if it had one) in a fresh container
        and re-executes the parent's first
        ``prefix_length`` actions (counted since the parent's last reset). After each one its
        ``workspace_digest`` must equal the parent's at that step; with ``strict=True`` its
        observation and error too.

        On either path the child inherits the parent's per-episode ``seed_root`` and
        ``max_steps``. Every refusal happens before any container or image is created. The child records its
        lineage (``parent_episode_id``, ``branch_step``, ``path``, ``checkpoint_id``, the
        verified ``workspace_digest``) and returns it.

        Args:
            child_episode_id: the child's id; generated if omitted.

        Raises:
            UnsupportedForkError: any other path, or a capability the path needs is not declared.
            ForkRequestError: an unknown checkpoint (or one of another episode), a prefix length
                out of range, or a missing argument.
            ReplayDivergenceError: a replayed step gave a different world (the child is
                destroyed); ForkVerificationError: a checkpoint's world did not come back whole;
                SubjectStateError: ``subject.import_state`` raised (the child is destroyed).
            LifecycleError / EpisodeNotFoundError / EpisodeExistsError: as usual.
        """
        parent = self._get(episode_id)
        fork_path = check_fork_path(path, self.capabilities)
        require(episode_id, parent.state, "fork")
        if fork_path is ForkPath.CHECKPOINT_IMPORT:
            if prefix_length is not None:
                raise ForkRequestError("checkpoint_import takes checkpoint_id, not prefix_length")
            entry = self._checkpoints.get(checkpoint_id) if isinstance(checkpoint_id, str) else None
            if entry is None or entry.record.episode_id != episode_id:
                raise ForkRequestError(
                    f"checkpoint_import needs checkpoint_id= a checkpoint of episode "
                    f"{episode_id!r}; {checkpoint_id!r} is not one (its checkpoints: "
                    f"{', '.join(parent.checkpoints) or 'none'})"
                )
        else:
            if checkpoint_id is not None:
                raise ForkRequestError("prefix_reexecution takes prefix_length, not checkpoint_id")
            check_prefix_length(prefix_length, len(parent.steps))
        # The child is the parent's episode again: same seed folder, same step limit.
        handle = await self.create_episode(
            episode_id=child_episode_id, max_steps=parent.max_steps, seed_root=parent.seed_root
        )
        child = self._episodes[handle.episode_id]
        started = time.perf_counter()
        try:
            if fork_path is ForkPath.CHECKPOINT_IMPORT:
                lineage = await self._import_checkpoint(parent, child, entry)
            else:
                lineage = await self._reexecute_prefix(parent, child, int(prefix_length or 0), strict)
        except BaseException:
            # A failed fork leaves no trace: no container, no folder, and its id free again.
            await asyncio.shield(self.destroy(episode_id=child.episode_id, cleanup=True))
            self._episodes.pop(child.episode_id, None)
            raise
        child.lineage = lineage
        child.store.write_record(self._record(child))
        (child.store.dir / "lineage.json").write_text(lineage.model_dump_json(indent=2))
        return ForkResult(
            episode_id=child.episode_id,
            state=child.state,
            lineage=lineage,
            duration_ms=_ms_since(started),
        )

    async def _import_checkpoint(
        self, parent: _Episode, child: _Episode, entry: _Checkpoint
    ) -> ForkLineage:
        record = entry.record
        async with child.lock:
            entry.users.add(child.episode_id)
            child.source_checkpoint = record.checkpoint_id
            await self._hold_slot(child)
            sandbox = await self._backend.start(
                self._spec(labels=self._labels(child.episode_id), seed=False, image=record.image_id)
            )
            child.sandbox = sandbox
            if child.state is EpisodeState.DESTROYED:  # destroyed while its container started
                await self._drop_sandbox(child, release=True)
                self._require_not_destroyed(child, "fork")
            if sandbox.hello.workspace_digest != record.workspace_digest:
                raise ForkVerificationError(
                    f"checkpoint {record.checkpoint_id} came back with workspace digest "
                    f"{sandbox.hello.workspace_digest}, not {record.workspace_digest}: the "
                    "checkpoint did not capture the workspace (is it on a volume or tmpfs?)"
                )
            try:
                await _maybe_await(self._subject.import_state(child.episode_id, record.subject_state))
            except Exception as err:
                raise SubjectStateError(
                    f"fork of {parent.episode_id!r} from {record.checkpoint_id}: subject.import_state "
                    f"raised {type(err).__name__}: {err}. The child was removed; fix the subject "
                    "adapter, then fork again."
                ) from err
            self._require_not_destroyed(child, "fork")
            child.steps = [
                step.model_copy(update={"episode_id": child.episode_id, "source_trace_id": child.source_trace_id})
                for step in entry.steps
            ]
            for step in child.steps:
                child.store.append_step(step)
            child.initial_digest = entry.initial_digest
            child.workspace_digest = record.workspace_digest
            child.state = _state_after(child.steps)
        return ForkLineage(
            parent_episode_id=parent.episode_id,
            branch_step=record.step_index,
            path="checkpoint_import",
            checkpoint_id=record.checkpoint_id,
            workspace_digest=record.workspace_digest,
        )

    async def _reexecute_prefix(
        self, parent: _Episode, child: _Episode, prefix_length: int, strict: bool
    ) -> ForkLineage:
        prefix = list(parent.steps[:prefix_length])
        expected_initial = parent.initial_digest
        await self.reset(episode_id=child.episode_id)
        if child.initial_digest != expected_initial:
            raise ReplayDivergenceError(
                f"the fresh world of the child differs from the parent's before any step "
                f"(digest {child.initial_digest} vs {expected_initial}): the seed image or "
                "seed files changed since the parent's reset",
                step=0,
                expected_digest=expected_initial,
                actual_digest=child.initial_digest,
            )
        for original in prefix:
            replayed = await self.step(episode_id=child.episode_id, action=original.action)
            expected = original.diagnostics["workspace_digest"]
            actual = replayed.diagnostics["workspace_digest"]
            same_observation = (replayed.observation, replayed.error) == (
                original.observation,
                original.error,
            )
            if actual != expected or (strict and not same_observation):
                what = "workspace digest" if actual != expected else "observation (strict mode)"
                raise ReplayDivergenceError(
                    f"replaying step {original.index} of {parent.episode_id!r} "
                    f"({_describe(original.action)}) gave a different {what}: parent "
                    f"{expected}, child {actual}. The prefix is not deterministic; this host "
                    "should not declare deterministic_prefix_reexecution for it.",
                    step=original.index,
                    expected_digest=expected,
                    actual_digest=actual,
                )
        return ForkLineage(
            parent_episode_id=parent.episode_id,
            branch_step=prefix_length,
            path="prefix_reexecution",
            workspace_digest=child.workspace_digest,
        )

    async def finalize(self, *, episode_id: str) -> FinalizeResult:
        """Seal the episode: copy its final workspace out, write its records, stop its container.

        Writes ``run_root/episodes/<id>/``: ``trajectory.jsonl`` (already appended per step),
        ``result.json`` and ``workspace/``. The workspace is extracted safely: nothing is written
        and no link made that leads outside ``workspace/``; permission bits are kept (minus
        setuid, setgid, sticky); sparse files stay sparse; at most ``artifact_budget_bytes`` of
        file data are copied. Whatever is not recreated is listed in ``skipped_paths`` with the
        reason, as readable text (links leading out, FIFOs, names that are not UTF-8 or too long
        for the host, what the budget cut off), and ``result.json`` is still written.

        A broken episode (its container died: see :class:`EpisodeBrokenError`) is finalized
        with what the host knows: its trajectory and ``broken`` (why it broke) are recorded,
        and ``workspace_path`` is ``None`` (there is no workspace to collect).

        Raises:
            LifecycleError: the episode never ran, is already finalized or destroyed, or was
                destroyed while finalize ran (it stays destroyed; no ``result.json``).
            UnsafeArchiveError: the workspace archive held a member whose *name* escapes the
                folder (no copy of a real folder has one).
        """
        episode = self._get(episode_id)
        require(episode_id, episode.state, "finalize")
        async with episode.lock:
            require(episode_id, episode.state, "finalize")
            store = episode.store
            await asyncio.to_thread(store.clear_workspace)
            self._require_not_destroyed(episode, "finalize")
            skipped = []
            if episode.broken is None:
                assert episode.sandbox is not None
                try:
                    # Exactly what is copied out: a full walk after the sweep.
                    episode.workspace_digest = await episode.sandbox.rescan()
                    skipped = await episode.sandbox.copy_out(
                        "/workspace", store.dir, byte_budget=self.artifact_budget_bytes
                    )
                except SandboxLostError as err:
                    # The container died since the last step: finalize what the host knows.
                    self._require_not_destroyed(episode, "finalize")
                    await self._broken(episode, str(err))
                except Exception:
                    self._require_not_destroyed(episode, "finalize")  # it failed *because* of that
                    raise
                self._require_not_destroyed(episode, "finalize")
            last = episode.steps[-1] if episode.steps else None
            final_output = (
                last.action.output
                if last is not None and isinstance(last.action, TerminateAction)
                else None
            )
            result = FinalizeResult(
                episode_id=episode_id,
                steps=len(episode.steps),
                terminated=bool(last and last.terminated),
                truncated=bool(last and last.truncated),
                final_output=final_output,
                workspace_digest=episode.workspace_digest,
                episode_dir=store.dir,
                workspace_path=store.workspace_path if episode.broken is None else None,
                broken=episode.broken,
                trajectory_path=store.trajectory_path,
                result_path=store.result_path,
                skipped_paths=skipped,
                source_trace_id=episode.source_trace_id,
            )
            store.write_result(result.model_dump_json(indent=2))
            store.close_trajectory()
            # Finalized before the await: a destroy meanwhile then moves it on to destroyed,
            # never the other way round.
            episode.state = EpisodeState.FINALIZED
            await self._drop_sandbox(episode, release=True)
            store.write_record(self._record(episode))
            return result

    async def destroy(self, *, episode_id: str, cleanup: bool = False) -> None:
        """Release the episode: remove its container and its checkpoint images.

        Idempotent: destroying a destroyed episode does nothing. Safe in any state, also while a
        step, hook, checkpoint or finalize runs: that call then fails with LifecycleError and
        the episode stays destroyed.

        Args:
            cleanup: also delete the episode's folder under ``run_root``, once any call in flight
                on the episode has stopped (so an ``on_step`` hook must not destroy its own
                episode with ``cleanup=True``: it would wait for itself). The deletion runs in a
                worker thread, so other episodes' steps are not held up by a large folder.

        Raises:
            EpisodeNotFoundError: this host never had the episode.
        """
        episode = self._get(episode_id)
        if episode.state is not EpisodeState.DESTROYED:
            episode.state = EpisodeState.DESTROYED
            await self._drop_sandbox(episode, release=True)
            # Containers a failed start may have left behind carry the episode's labels too.
            await self._backend.remove_labelled(
                {L.EPISODE: episode_id, L.HOST: self.host_id}
            )
            for checkpoint_id in episode.checkpoints:
                entry = self._checkpoints.get(checkpoint_id)
                if entry is not None:
                    entry.released = True
            await self._collect_checkpoints()
            episode.store.close_trajectory()
            if not cleanup:
                episode.store.write_record(self._record(episode))
        if cleanup:
            # After the call in flight (which fails now that the container is gone) has let go,
            # so nothing writes into the folder while or after it is deleted.
            async with episode.lock:
                await asyncio.to_thread(episode.store.remove)

    async def close(self) -> None:
        """Destroy every episode this host still holds (their folders stay) and release Docker.

        Idempotent. Tries everything even when a part fails, then raises SandboxError saying
        what could not be released.
        """
        if self._closed:
            return
        self._closed = True
        try:
            outcomes = await asyncio.gather(
                *(
                    self.destroy(episode_id=episode_id)
                    for episode_id, episode in list(self._episodes.items())
                    if episode.state is not EpisodeState.DESTROYED
                ),
                return_exceptions=True,
            )
            if self.pool is not None:
                await self.pool.close()
            await asyncio.gather(*list(self._retiring), return_exceptions=True)
            await self._backend.remove_labelled({L.HOST: self.host_id})
            await self._collect_checkpoints()
        finally:
            await self._backend.close()
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        left = [entry.record.image_id for entry in self._checkpoints.values()]
        if failures or left:
            raise SandboxError(
                f"close() could not release everything: {len(failures)} episodes failed to "
                f"destroy ({'; '.join(str(f) for f in failures[:3])}), {len(left)} checkpoint "
                "images remain. `softprobe-gym gc` removes them once this process has exited."
            ) from (failures[0] if failures else None)

    # -- internals -----------------------------------------------------------------------------

    def _get(self, episode_id: str) -> _Episode:
        try:
            return self._episodes[episode_id]
        except (KeyError, TypeError):
            raise EpisodeNotFoundError(str(episode_id)) from None

    def _check_open(self) -> None:
        if self._closed:
            raise LifecycleError("*", "closed", "use", "this host is closed; create a new one")

    @staticmethod
    def _require_not_destroyed(episode: _Episode, operation: str) -> None:
        """Checked after every await of a call: destroy may have run meanwhile, and a destroyed
        episode must stay destroyed (no state change, no record written)."""
        if episode.state is EpisodeState.DESTROYED:
            raise LifecycleError(
                episode.episode_id, "destroyed", operation, "it was destroyed while the call ran"
            )

    def _require_usable(self, episode: _Episode, operation: str) -> None:
        require(episode.episode_id, episode.state, operation)
        if episode.broken is not None:
            raise EpisodeBrokenError(episode.episode_id, episode.broken)

    async def _call_tool(self, episode: _Episode, sandbox: Sandbox, action: ToolAction) -> Any:
        timeout_s = self.tool_timeout_s
        asked = action.args.get("timeout_s")
        if action.name == "shell.exec" and isinstance(asked, (int, float)) and not isinstance(asked, bool):
            timeout_s = min(max(float(asked), 0.001), self.max_tool_timeout_s)
        try:
            return await sandbox.call_tool(
                tool=action.name,
                args=dict(action.args),
                timeout_s=timeout_s,
                output_cap=self.output_cap_bytes,
            )
        except SandboxLostError as err:
            raise await self._broken(episode, str(err)) from err

    async def _run_hook(
        self, episode: _Episode, sandbox: Sandbox, action: Any, result: StepResult
    ) -> Exception | None:
        if self._on_step is None:
            return None
        ctx = StepContext(episode.episode_id, action, result, sandbox)
        try:
            result.diagnostics.update(await call_hook(self._on_step, ctx))
        except SandboxLostError as err:
            raise await self._broken(episode, str(err)) from err
        except Exception as err:  # the hook is the caller's code: report it, keep the step
            return err
        return None

    async def _broken(self, episode: _Episode, reason: str) -> Exception:
        if episode.state is EpisodeState.DESTROYED:
            return LifecycleError(
                episode.episode_id, "destroyed", "step", "it was destroyed while the step ran"
            )
        episode.broken = reason
        await self._drop_sandbox(episode, release=True)
        episode.store.write_record(self._record(episode))
        return EpisodeBrokenError(episode.episode_id, reason)

    async def settle(self) -> None:
        """Wait until containers that ``reset`` retired in the background are removed."""
        while self._retiring:
            await asyncio.gather(*list(self._retiring), return_exceptions=True)

    async def warm_up(self) -> None:
        """Fill the warm pool now (``pool_size``), instead of on the first reset."""
        if self.pool is not None:
            await self._sweep_once()
            await self.pool.wait_ready()

    def _spec(
        self, *, labels: dict[str, str], seed: bool, image: str | None = None, seed_root: Path | None = None
    ) -> SandboxSpec:
        return SandboxSpec(
            image=image or self.image,
            settings=self.container_settings,
            labels=labels,
            seed_root=(seed_root or self.seed_root) if seed else None,
            # A fresh workspace (seeded now, or later by the pool's taker) unless the image is a
            # checkpoint that already holds one.
            copy_seed=seed or image is None,
            digest_mode=self.workspace_tracking,
        )

    async def _start_for(self, episode_id: str, seed_root: Path | None) -> Sandbox:
        """A fresh sandbox with the seed files: from the warm pool if one is ready, else cold."""
        if self.pool is not None:
            sandbox = self.pool.take()
            if sandbox is not None:
                try:
                    await sandbox.seed(seed_root)
                    return sandbox
                except BaseException:
                    await asyncio.shield(sandbox.remove())
                    raise
        return await self._backend.start(self._spec(labels=self._labels(episode_id), seed=True, seed_root=seed_root))

    async def _hold_slot(self, episode: _Episode) -> None:
        if self._slots is not None and not episode.holds_slot:
            await self._slots.acquire()
            episode.holds_slot = True

    def _release_slot(self, episode: _Episode) -> None:
        if self._slots is not None and episode.holds_slot:
            episode.holds_slot = False
            self._slots.release()

    async def _drop_sandbox(self, episode: _Episode, *, release: bool = False, background: bool = False) -> None:
        sandbox, episode.sandbox = episode.sandbox, None
        if sandbox is not None and background:
            task = asyncio.ensure_future(sandbox.remove())
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        elif sandbox is not None:
            await sandbox.remove()
        if release:
            self._release_slot(episode)
        source, episode.source_checkpoint = episode.source_checkpoint, None
        if source is not None and source in self._checkpoints:
            self._checkpoints[source].users.discard(episode.episode_id)
            await self._collect_checkpoints()

    async def _collect_checkpoints(self) -> None:
        """Remove the images of checkpoints nobody can use any more: their episode is destroyed
        and no container runs from them. Newest first, since a checkpoint taken in a forked child
        is built on its parent's image and Docker removes parents only after their children."""
        async with self._collect_lock:
            while True:
                unused = [
                    entry
                    for entry in self._checkpoints.values()
                    if entry.released and not entry.users
                ]
                unused.sort(key=lambda entry: entry.record.created_at, reverse=True)
                removed = 0
                for entry in unused:
                    if await self._backend.remove_image(entry.record.image_id):
                        self._checkpoints.pop(entry.record.checkpoint_id, None)
                        removed += 1
                if not removed or removed == len(unused):
                    return

    async def _sweep_once(self) -> None:
        if not self._sweep_pending:
            return
        async with self._sweep_lock:
            if self._sweep_pending:
                await self._backend.sweep()
                self._sweep_pending = False

    def _labels(self, episode_id: str) -> dict[str, str]:
        return {
            L.MANAGED: "true",
            L.EPISODE: episode_id,
            L.OWNER: L.current_owner(),
            L.HOST: self.host_id,
        }

    def _record(self, episode: _Episode) -> dict[str, Any]:
        return {
            "episode_id": episode.episode_id,
            "state": episode.state.value,
            "image": self.image,
            "container_id": episode.sandbox.sandbox_id if episode.sandbox else None,
            "steps": len(episode.steps),
            "broken": episode.broken,
            "owner": L.current_owner(),
            "host_id": self.host_id,
            "checkpoints": list(episode.checkpoints),
            "lineage": episode.lineage.model_dump() if episode.lineage else None,
            "source_trace_id": episode.source_trace_id,
        }


def create_host_environment(
    *,
    run_root: str | Path,
    seed_root: str | Path | None = None,
    image: str = DEFAULT_IMAGE,
    capabilities: Capabilities | dict[str, bool] | None = None,
    on_step: OnStepHook | None = None,
    subject: Any = None,
    container: ContainerSettings | dict[str, Any] | None = None,
    tool_timeout_s: float = 30.0,
    max_tool_timeout_s: float = 600.0,
    output_cap_bytes: int = 1024 * 1024,
    max_steps: int | None = None,
    docker_host: str | None = None,
    backend: SandboxBackend | None = None,
    sweep_on_start: bool = True,
    pool_size: int = 0,
    max_containers: int | None = None,
    workspace_tracking: str = "inotify",
    artifact_budget_bytes: int | None = DEFAULT_ARTIFACT_BUDGET_BYTES,
    checkpoint_budget_bytes: int | None = DEFAULT_CHECKPOINT_BUDGET_BYTES,
) -> HostEnvironment:
    """Create a host that runs each episode in its own Docker container.

    Args:
        run_root: folder for per-episode logs and artifacts (created if missing).
        seed_root: folder copied into ``/workspace`` on every reset; ``None`` for an empty one.
        image: the seed image (default ``softprobe/base:latest``; build it with
            ``softprobe-gym images build``). Any image with ``python3`` and ``/bin/sh`` works.
        capabilities: what the host declares (see :class:`Capabilities`); the Docker default is
            checkpoint and prefix re-execution, no subject state import.
        on_step: ``hook(ctx)`` (sync or async) run after every step; its dict is merged into
            ``result.diagnostics``. ``ctx`` has ``episode_id``, ``action``, ``result`` and the
            async helpers ``exists(path)`` and ``read_text(path)``.
        subject: needed with ``subject_state_import``: an object with ``export_state(episode_id)``
            and ``import_state(episode_id, state)``, sync or async.
        container: :class:`ContainerSettings` (or a dict of them) to relax the secure defaults.
        tool_timeout_s: default time limit of a tool call.
        max_tool_timeout_s: the most a ``shell.exec`` may ask for with its ``timeout_s``.
        output_cap_bytes: bytes of tool output kept per step (head and tail around a marker).
        max_steps: steps after which the episode is truncated (``truncated=True``).
        docker_host: Docker engine address; default ``DOCKER_HOST``, then the current Docker
            context, then the default socket.
        backend: a custom :class:`SandboxBackend` (tests, other providers).
        sweep_on_start: on first use, remove containers and images left by host processes of
            this machine that are gone.
        pool_size: keep this many containers started ahead (a warm pool): a reset then only
            copies the seed files into one. Each pooled container serves one episode only.
        max_containers: at most this many episodes hold a container at once; further resets
            wait for a finalize or destroy (the warm pool comes on top).
        workspace_tracking: how the shim keeps ``workspace_digest`` current: ``"inotify"``
            (default: cost in proportion to what changed; misses writes made through ``mmap``)
            or ``"scan"`` (re-read the whole workspace after each process: exact, slower).
        artifact_budget_bytes: the most file data (apparent size) ``finalize`` copies out of
            a workspace (default 2 GiB). Enforced while the copy streams; what would exceed it
            is not copied and is listed in ``skipped_paths``. ``None``: no limit.
        checkpoint_budget_bytes: the most filesystem changes (apparent size, as Docker's
            ``SizeRw`` counts them) a ``checkpoint`` commits (default 2 GiB); over it,
            ``CheckpointTooLargeError`` and nothing is committed. ``None``: no limit.

    Raises:
        ConfigurationError: an argument is invalid or of the wrong type (checked by
            :class:`~softprobe.gym.episodes.config.HostOptions`; the message names each option,
            says why, and what it got). Numbers are not taken from strings, nor counts from
            booleans.
    """
    options = HostOptions.parse(
        run_root=run_root, seed_root=seed_root, image=image,
        capabilities=Capabilities() if capabilities is None else capabilities,
        on_step=on_step, subject=subject,
        container=ContainerSettings() if container is None else container,
        tool_timeout_s=tool_timeout_s, max_tool_timeout_s=max_tool_timeout_s,
        output_cap_bytes=output_cap_bytes, max_steps=max_steps, docker_host=docker_host,
        backend=backend, sweep_on_start=sweep_on_start, pool_size=pool_size,
        max_containers=max_containers, workspace_tracking=workspace_tracking,
        artifact_budget_bytes=artifact_budget_bytes, checkpoint_budget_bytes=checkpoint_budget_bytes,
    )
    try:
        options.run_root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigurationError(f"cannot create run_root {options.run_root}: {err.strerror}") from None
    backend = options.backend
    if backend is None:
        from softprobe.gym.providers.docker.provider import DockerBackend

        docker_backend = DockerBackend(docker_host=options.docker_host)
        try:
            docker_backend.check_settings(options.container)  # e.g. an unknown runtime: refused now
        except BaseException:
            docker_backend.discard()
            raise
        backend = docker_backend
    else:
        backend.check_settings(options.container)
    return HostEnvironment(
        run_root=options.run_root,
        seed_root=options.seed_root,
        image=options.image,
        capabilities=options.capabilities,
        on_step=options.on_step,
        subject=options.subject,
        container=options.container,
        tool_timeout_s=options.tool_timeout_s,
        max_tool_timeout_s=options.max_tool_timeout_s,
        output_cap_bytes=options.output_cap_bytes,
        max_steps=options.max_steps,
        backend=backend,
        sweep_on_start=options.sweep_on_start,
        pool_size=options.pool_size,
        max_containers=options.max_containers,
        workspace_tracking=options.workspace_tracking,
        artifact_budget_bytes=options.artifact_budget_bytes,
        checkpoint_budget_bytes=options.checkpoint_budget_bytes,
    )


def _state_after(steps: list[StepResult]) -> EpisodeState:
    if not steps:
        return EpisodeState.READY
    last = steps[-1]
    return EpisodeState.TERMINATED if last.terminated or last.truncated else EpisodeState.RUNNING


def _describe(action: ToolAction | TerminateAction) -> str:
    return f"tool {action.name}" if isinstance(action, ToolAction) else "terminate"


async def _maybe_await(value: Any) -> Any:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
