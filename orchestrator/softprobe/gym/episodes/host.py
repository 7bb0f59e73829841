"""The local host: the episode API (create, reset, step, checkpoint, fork, finalize, destroy)
composed from the registry, admission, checkpoints, forking and stepping modules beside it.

Each episode runs in its own sandbox started by a provider (Docker by default); its tools run
through the shim inside it. The host owns every episode's state machine; its folder under
``run_root`` is written by the episode's :class:`~softprobe.gym.episodes.store.EpisodeStore`.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from pathlib import Path

from softprobe.gym.actions import TerminateAction
from softprobe.gym.episodes.admission import Admission
from softprobe.gym.episodes.checkpoints import CheckpointRegistry
from softprobe.gym.episodes.config import HostConfig
from softprobe.gym.episodes.forking import Forker, ForkResult
from softprobe.gym.episodes.pool import WarmPool
from softprobe.gym.episodes.registry import Episode, EpisodeRegistry, step_limit
from softprobe.gym.episodes.stepping import Score, Stepper
from softprobe.gym.episodes.store import EpisodeStore, validate_episode_id
from softprobe.gym.episodes.toolspecs import ToolSchema, offered_tools, tool_schemas
from softprobe.gym.errors import (
    CapabilityError,
    ConfigurationError,
    EpisodeExistsError,
    InvalidActionError,
    LifecycleError,
    RunRootWriteError,
    SandboxError,
    SandboxLostError,
)
from softprobe.gym.providers.base import Provider
from softprobe.gym.results import (
    CheckpointRecord,
    EpisodeHandle,
    EpisodeState,
    FinalizeResult,
    ProcessResult,
    ResetResult,
    SkippedMember,
    StepError,
    StepResult,
)
from softprobe.gym.runtime import Runtime
from softprobe.gym.settings import Capabilities
from softprobe.gym.shim.client import ShimRefusedError
from softprobe.gym.shim.protocol import ExecRequest
from softprobe.gym.tapes.attempt import CLOSURE_REPORT_FILE, check_tape_options, write_closure_report
from softprobe.gym.tapes.clock import check_random_seed, check_time_policy
from softprobe.gym.text import has_surrogate
from softprobe.gym.verifiers import VerifierResult


class HostEnvironment:
    """The local :class:`~softprobe.gym.episodes.protocol.Host`: runs episodes, each in its own
    sandbox of one provider (Docker by default). Create it with :func:`create_host_environment`
    or from a :class:`HostConfig`. Use it as ``async with ... as host:`` or call :meth:`close`.

    Calls on one episode are served one at a time; calls on different episodes run concurrently.
    """

    def __init__(self, config: HostConfig, provider: Provider, *, owns_provider: bool = True) -> None:
        self.config = config
        self.provider = provider
        self._owns_provider = owns_provider  # close() releases only a provider made for this host
        self.host_id = uuid.uuid4().hex[:16]
        self._registry = EpisodeRegistry(config, self.host_id)
        self._checkpoints = CheckpointRegistry(provider, self._registry)
        self._admission = Admission(provider, self._registry, self._checkpoints, sweep_on_start=config.sweep_on_start)
        self._stepper = Stepper(config, self._admission, self._registry.tracing)
        self._forker = Forker(self, self._registry, self._admission, self._checkpoints, subject=config.subject)
        self._closed = False

    # -- configuration ---------------------------------------------------------------------------

    @property
    def run_root(self) -> Path:
        """The folder holding ``episodes/<episode_id>/``."""
        return self.config.run_root

    @property
    def capabilities(self) -> Capabilities:
        """What this host declares."""
        return self.config.capabilities

    @property
    def image(self) -> str:
        """The seed image."""
        return self.config.image

    @property
    def pool(self) -> WarmPool | None:
        """The warm pool (with ``pool_size``), else None."""
        return self._admission.pool

    @property
    def held_slots(self) -> int:
        """Episodes holding a sandbox, counted when ``max_containers`` is set."""
        return self._admission.held_slots

    # -- context manager -------------------------------------------------------------------------

    async def __aenter__(self) -> HostEnvironment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- queries ---------------------------------------------------------------------------------

    def state(self, *, episode_id: str) -> EpisodeState:
        """The episode's lifecycle state. Raises EpisodeNotFoundError."""
        return self._registry.get(episode_id).state

    def trajectory(self, *, episode_id: str) -> list[StepResult]:
        """The steps taken since the episode's last reset. Raises EpisodeNotFoundError."""
        return list(self._registry.get(episode_id).steps)

    def runtime_of(self, *, episode_id: str) -> Runtime | None:
        """The episode's live sandbox and shim connection, if it has one.

        For diagnostics, benchmarks and tests (``sandbox_id``, ``hello``): the host owns it, so
        never step, seed or remove it through this. Raises EpisodeNotFoundError.
        """
        return self._registry.get(episode_id).runtime

    async def tool_specs(self, *, episode_id: str) -> list[ToolSchema]:
        """Every tool of the episode as JSON Schema; see :meth:`Host.tool_specs`."""
        episode = self._registry.get(episode_id)
        runtime = episode.runtime
        if runtime is None:
            raise LifecycleError(
                episode_id, episode.state.value, "list the tools of",
                "its tools are known while it has a sandbox: reset it first",
            )
        return tool_schemas(runtime.hello.tools, sessions=self.capabilities.sessions)

    def set_max_steps(self, *, episode_id: str, max_steps: int | None) -> None:
        """Change one episode's step limit (None: the host's ``max_steps``).

        Raises:
            EpisodeNotFoundError: no such episode.
            ConfigurationError: ``max_steps`` is not a positive int or None.
        """
        episode = self._registry.get(episode_id)
        episode.max_steps = step_limit(max_steps)

    # -- lifecycle -------------------------------------------------------------------------------

    async def create_episode(
        self,
        *,
        episode_id: str | None = None,
        max_steps: int | None = None,
        seed_root: str | Path | None = None,
        tape_mode: str | None = None,
        tape: str | Path | None = None,
        record_processes: bool | None = None,
        time_policy: str | None = None,
        random_seed: int | None = None,
    ) -> EpisodeHandle:
        """Reserve an episode id and its folder; see :meth:`Host.create_episode`. ``tape_mode``,
        ``tape`` and ``record_processes`` override the host's for this episode (``tape``: exactly
        the folder to record to or replay); so do ``time_policy`` and ``random_seed`` (None: the
        host's; see :func:`~softprobe.gym.create_host_environment`)."""
        self._check_open()
        episode_id = validate_episode_id(f"ep-{uuid.uuid4().hex[:12]}" if episode_id is None else episode_id)
        if episode_id in self._registry:
            raise EpisodeExistsError(
                f"episode {episode_id!r} already exists on this host; pick another id or destroy it first"
            )
        limit = step_limit(max_steps)
        mode, tape_path = check_tape_options(tape_mode, tape)
        if record_processes is not None and not isinstance(record_processes, bool):
            raise ConfigurationError(f"record_processes must be True, False or None, not {record_processes!r}")
        policy, seed_value = check_time_policy(time_policy), check_random_seed(random_seed)
        seed = None
        if seed_root is not None:
            seed = Path(seed_root).expanduser().resolve()
            if not seed.is_dir():
                raise ConfigurationError(f"seed_root {seed} is not a directory")
        episode = Episode(episode_id, EpisodeStore(self.run_root, episode_id), max_steps=limit, seed_root=seed,
                          tape_mode=mode, tape_path=tape_path, record_processes=record_processes,
                          time_policy=policy, random_seed=seed_value)
        episode.store.create(self._registry.record(episode))  # claims the folder, or EpisodeExistsError
        self._registry.add(episode)
        return EpisodeHandle(episode_id=episode_id, state=episode.state, episode_dir=episode.store.dir)

    async def reset(self, *, episode_id: str) -> ResetResult:
        """Start the episode afresh from the seed; see :meth:`Host.reset`."""
        episode = self._registry.get(episode_id)
        episode.require("reset")
        # The span begins the attempt's trace (a new one, or the one a fork began for its child).
        async with episode.lock, self._registry.tracing.reset(episode.trace) as span:
            episode.require("reset")
            started = time.perf_counter()
            # The old sandbox goes in the background: nothing waits for its removal.
            await self._admission.drop(episode, background=True)
            runtime = await self._admission.start_seeded(episode, episode.seed_root or self.config.seed_root)
            if episode.state is EpisodeState.DESTROYED:  # destroyed while the sandbox started
                await runtime.remove()
                self._admission.release_slot(episode)
                episode.require_not_destroyed("reset")
            hello = runtime.hello
            episode.runtime = runtime
            episode.steps = []
            episode.broken = None
            self._registry.start_tape(episode)
            clock = await self._registry.start_clock(episode, runtime)
            episode.source_trace_id = span.trace_id or episode.source_trace_id
            episode.initial_digest = episode.workspace_digest = hello.workspace_digest
            episode.state = EpisodeState.READY
            episode.store.start_trajectory()
            self._registry.save(episode)
            offered = offered_tools(hello.tools, sessions=self.capabilities.sessions)
            return ResetResult(
                episode_id=episode_id,
                observation={"tools": [tool.name for tool in offered], "workspace_files": hello.workspace_files,
                             **({"instruction": self.config.instruction} if self.config.instruction is not None
                                else {})},
                diagnostics={
                    "workspace_digest": hello.workspace_digest,
                    "changed_paths": [],
                    "image_id": runtime.image_id,
                    "shim_version": hello.shim_version,
                    **({"clock": clock.diagnostics()} if clock.reported else {}),
                },
                tools=[tool.info() for tool in offered],
                source_trace_id=episode.source_trace_id,
                duration_ms=_ms_since(started),
            )

    async def step(
        self, *, episode_id: str, action: object, score: Score | None = None, refused: StepError | None = None
    ) -> StepResult:
        """Apply one action; see :meth:`Host.step` (``score``: the training session's rewards).

        ``refused``: the agent's policy could not make this tool call (e.g. a model's malformed
        arguments): nothing runs; the step is recorded with ``refused`` as its error and its
        message as the observation. Only for a tool action (InvalidActionError otherwise).
        """
        return await self._stepper.step(self._registry.get(episode_id), action, score=score, refused=refused)

    async def run_process(
        self,
        *,
        episode_id: str,
        argv: list[str],
        stdin: bytes = b"",
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
        output_cap: int | None = None,
        user: str | int | None = None,
    ) -> ProcessResult:
        """Run one program in the episode's sandbox for a harness (Inspect's ``exec``, a Harbor
        environment's commands), not as a step: it is not in the trajectory (the harness keeps
        its own log of it). By default it runs exactly as the agent's ``shell.exec`` does:
        under the episode's agent uid without capabilities, the workspace quota polled. Whoever
        it runs as, no other process of the sandbox runs meanwhile and every process it started
        is killed when it ends (no process outlives it). The workspace digest the next step
        starts from includes what it changed.

        Args:
            argv: the program and its arguments; ``argv[0]`` is looked up in ``PATH`` of its
                environment (the agent's, with ``env`` added).
            stdin: its standard input (any bytes; empty: end of file at once).
            cwd: its working folder, absolute or relative to ``/workspace`` (None: that).
            env: variables added to the agent's environment.
            timeout_s: it and every process it started are killed after this long (None: the
                host's ``tool_timeout_s``; at most ``max_tool_timeout_s``); the result's
                ``error`` is then ``timeout``.
            output_cap: bytes kept of each of stdout and stderr, the last ones (None: the host's
                ``output_cap_bytes``); the full lengths are in the result.
            user: None, the agent; else a user name or uid of the sandbox, or ``"root"`` /
                ``0``, without the agent's workspace quota. A program run as root holds the
                sandbox's privileges (it could end the shim): only this process's caller, never
                an agent, chooses it, and whether that program is trusted is the caller's
                business. Inspect's sandbox never passes it (it refuses ``user=``).

        Returns:
            A :class:`~softprobe.gym.results.ProcessResult`; a program that cannot be started
            is one with ``spawn_error`` set (``EACCES``, ``ENOENT``, ...), not an exception.

        Raises:
            InvalidActionError: an argument is not of that shape (NUL characters, a ``=`` in a
                variable's name, a user the sandbox does not have, ...); nothing ran.
            LifecycleError: the episode is not ready, running or terminated.
            EpisodeBrokenError: its sandbox died (before or during the program).
        """
        episode = self._registry.get(episode_id)
        request = _exec_request(argv, cwd, env, timeout_s, output_cap, user, self.config)
        if not isinstance(stdin, bytes):
            raise InvalidActionError(f"stdin must be bytes, not {type(stdin).__name__}")
        episode.require_usable("run_process")
        async with episode.lock:
            runtime = episode.live_runtime("run_process")
            try:
                result = await runtime.run_process(request, stdin)
            except SandboxLostError as err:
                raise await self._admission.mark_broken(episode, str(err), "run_process") from err
            except ShimRefusedError as err:
                raise InvalidActionError(f"the process was refused: {err.detail}") from None
            episode.require_not_destroyed("run_process")
            episode.workspace_digest = result.workspace_digest
            if episode.state is EpisodeState.READY:
                episode.state = EpisodeState.RUNNING
            return result

    async def checkpoint(self, *, episode_id: str, scope: str | None = None) -> CheckpointRecord:
        """Commit the episode's sandbox (or archive its workspace, with
        ``checkpoint_scope="workspace"``; or save its processes and memory too, with
        ``scope="live"``) for a later fork; see :meth:`Host.checkpoint`."""
        episode = self._registry.get(episode_id)
        if not self.capabilities.environment_checkpoint:
            raise CapabilityError(
                "checkpoint needs the environment_checkpoint capability; declare it with "
                "create_host_environment(capabilities={'environment_checkpoint': True, ...})"
            )
        live = scope == "live"
        if live and not self.capabilities.live_checkpoint:
            raise CapabilityError(
                "checkpoint(scope='live') needs the live_checkpoint capability, declared, never inferred: "
                "create_host_environment(capabilities={'live_checkpoint': True, ...}) (gVisor, an engine with "
                "experimental mode on)"
            )
        if scope is not None and not live and scope != self.capabilities.checkpoint_scope:
            raise CapabilityError(
                f"checkpoint scope {scope!r} is not this host's: it declares checkpoint_scope="
                f"{self.capabilities.checkpoint_scope!r}"
                f"{' and live_checkpoint' if self.capabilities.live_checkpoint else ''}"
                "; pass scope=None, 'live' or the declared scope"
            )
        episode.require_usable("checkpoint")
        async with episode.lock, self._registry.tracing.span(episode.trace, "checkpoint"):
            episode.require_usable("checkpoint")
            try:
                return await self._checkpoints.take(episode, subject=self.config.subject, live=live)
            except SandboxLostError as err:
                episode.require_not_destroyed("checkpoint")
                raise await self._admission.mark_broken(episode, str(err), "checkpoint") from err
            except Exception:
                episode.require_not_destroyed("checkpoint")  # it failed *because* of that
                raise

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
        """Branch a child episode by one of the two legal paths; see :meth:`Host.fork`."""
        parent = self._registry.get(episode_id)
        return await self._forker.fork(parent, path, checkpoint_id, prefix_length, child_episode_id, strict)

    async def fork_many(
        self,
        *,
        episode_id: str,
        n: int,
        path: str,
        checkpoint_id: str | None = None,
        prefix_length: int | None = None,
        child_episode_ids: list[str] | None = None,
        strict: bool = False,
    ) -> list[ForkResult]:
        """Branch ``n`` children off one branch point at once; see :meth:`Host.fork_many`."""
        parent = self._registry.get(episode_id)
        return await self._forker.fork_many(parent, n, path, checkpoint_id, prefix_length, child_episode_ids, strict)

    async def finalize(self, *, episode_id: str) -> FinalizeResult:
        """Seal the episode and collect its records; see :meth:`Host.finalize`."""
        episode = self._registry.get(episode_id)
        episode.require("finalize")
        async with episode.lock, self._registry.tracing.span(episode.trace, "finalize", closes=True):
            episode.require("finalize")
            store = episode.store
            await asyncio.to_thread(store.clear_workspace)
            episode.require_not_destroyed("finalize")
            if self.capabilities.sessions and episode.runtime is not None and episode.broken is None:
                await self._stepper.close_sessions(episode)  # none runs beside the verifier or the copy
                episode.require_not_destroyed("finalize")
            verdict = await self._stepper.final_verdict(episode)  # the world's verifier (verifiers.py)
            episode.require_not_destroyed("finalize")
            try:
                result = await self._seal(episode, verdict)
            except RunRootWriteError as err:
                # Nothing is finalized: no half-copied workspace stays, the episode is as it was.
                await asyncio.to_thread(store.clear_workspace)
                episode.require_not_destroyed("finalize")
                raise err.again(
                    f"finalize of episode {episode_id!r} could not write {err.path}: {err.cause}. Nothing "
                    f"was finalized: the episode is still {episode.state.value!r}"
                    f"{' with its sandbox' if episode.runtime else ''}, and no result.json or workspace/ "
                    f"was left. {err.remedy}, then call finalize again."
                ) from None
            store.close_trajectory()
            # Finalized before the await: a destroy meanwhile then moves it on to destroyed,
            # never the other way round.
            episode.state = EpisodeState.FINALIZED
            await self._admission.drop(episode, release=True)
            self._registry.save(episode, best_effort=True)  # result.json, written, is the record
            return result

    async def _seal(self, episode: Episode, verdict: VerifierResult | None) -> FinalizeResult:
        """Copy the workspace out (unless broken) and write the closure report and
        ``result.json``; the result. Raises RunRootWriteError when any of it cannot be written."""
        store = episode.store
        skipped = await self._collect_workspace(episode) if episode.broken is None else []
        # What the world's egress proxy saw (None unless the network policy is egress).
        egress = await episode.runtime.sandbox.egress_report() if episode.runtime and not episode.broken else None
        last = episode.steps[-1] if episode.steps else None
        final_output = last.action.output if last is not None and isinstance(last.action, TerminateAction) else None
        try:
            closure_report_path = write_closure_report(episode.tape, store.dir)
        except OSError as err:
            raise RunRootWriteError.from_os_error(err, store.dir / CLOSURE_REPORT_FILE, "no report was left") from None
        result = FinalizeResult(
            episode_id=episode.episode_id,
            steps=len(episode.steps),
            terminated=bool(last and last.terminated),
            truncated=bool(last and last.truncated),
            final_output=final_output,
            workspace_digest=episode.workspace_digest,
            episode_dir=store.dir,
            workspace_path=store.workspace_path if episode.broken is None else None,
            broken=episode.broken,
            trajectory_path=store.trajectory_path,
            verifier=verdict,
            world_source=self.config.world_source,
            result_path=store.result_path,
            skipped_paths=skipped,
            source_trace_id=episode.source_trace_id,
            egress=egress,
            bundle_digest=self.config.bundle_digest,
            closure_report_path=closure_report_path,
        )
        store.write_result(result.model_dump_json(indent=2))
        return result

    async def _collect_workspace(self, episode: Episode) -> list[SkippedMember]:
        """Copy the final workspace out (exactly what a full walk after the sweep saw). A
        sandbox that died since the last step breaks the episode: finalize records that."""
        runtime = episode.live_runtime("finalize")
        try:
            episode.workspace_digest = await runtime.rescan()
            skipped = await runtime.copy_out_workspace(episode.store.dir, byte_budget=self.config.artifact_budget_bytes)
        except SandboxLostError as err:
            episode.require_not_destroyed("finalize")
            await self._admission.mark_broken(episode, str(err), "finalize")
            episode.require_not_destroyed("finalize")  # destroyed while the dead sandbox went
            return []
        except Exception:
            episode.require_not_destroyed("finalize")  # it failed *because* of that
            raise
        episode.require_not_destroyed("finalize")
        return skipped

    async def destroy(self, *, episode_id: str, cleanup: bool = False) -> None:
        """Release the episode (idempotent); see :meth:`Host.destroy`."""
        episode = self._registry.get(episode_id)
        if episode.state is not EpisodeState.DESTROYED:
            episode.state = EpisodeState.DESTROYED
            self._registry.tracing.end(episode.trace)
            await self._admission.drop(episode, release=True)
            # Sandboxes a failed start may have left behind carry the episode's labels too.
            await self._admission.remove_leftovers(episode_id)
            await self._checkpoints.release(episode)
            episode.store.close_trajectory()
            if not cleanup:
                self._registry.save(episode, best_effort=True)
        if cleanup:
            # After the call in flight (which fails now that the sandbox is gone) has let go,
            # so nothing writes into the folder while or after it is deleted.
            async with episode.lock:
                await asyncio.to_thread(episode.store.remove)

    async def close(self) -> None:
        """Destroy every episode still held and release the provider; see :meth:`Host.close`."""
        if self._closed:
            return
        self._closed = True
        try:
            outcomes = await asyncio.gather(
                *(self.destroy(episode_id=episode.episode_id) for episode in self._registry.live()),
                return_exceptions=True,
            )
            await self._admission.close()
            await self._checkpoints.collect()
        finally:
            if self._owns_provider:
                await self.provider.close()
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        left = self._checkpoints.remaining_images()
        if failures or left:
            raise SandboxError(
                f"close() could not release everything: {len(failures)} episodes failed to "
                f"destroy ({'; '.join(str(f) for f in failures[:3])}), {len(left)} checkpoint "
                "images remain. `softprobe-gym gc` removes them once this process has exited."
            ) from (failures[0] if failures else None)

    async def settle(self) -> None:
        """Wait until sandboxes that ``reset`` retired in the background are removed."""
        await self._admission.settle()

    async def warm_up(self) -> None:
        """Fill the warm pool now (``pool_size``), instead of on the first reset."""
        await self._admission.warm_up()

    def _check_open(self) -> None:
        if self._closed:
            raise LifecycleError("*", "closed", "use", "this host is closed; create a new one")


def _exec_request(
    argv: object, cwd: object, env: object, timeout_s: object, output_cap: object, user: object, config: HostConfig
) -> ExecRequest:
    """The shim's ``exec`` request for :meth:`HostEnvironment.run_process`'s arguments."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise InvalidActionError("argv must be a non-empty list of strings")
    if cwd is not None and (not isinstance(cwd, str) or not cwd):
        raise InvalidActionError("cwd must be a non-empty string or None")
    env = {} if env is None else env
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and k and "=" not in k and isinstance(v, str) for k, v in env.items()
    ):
        raise InvalidActionError("env must map variable names (without '=') to strings")
    if user is not None and not (isinstance(user, str) and user) and not (
            isinstance(user, int) and not isinstance(user, bool) and 0 <= user < 1 << 32):
        raise InvalidActionError(f"user must be a user name or uid of the sandbox, or None, not {user!r}")
    texts = [*argv, *(env.keys()), *(env.values()), *(t for t in (cwd, user) if isinstance(t, str))]
    if any("\x00" in text or has_surrogate(text) for text in texts):
        raise InvalidActionError("argv, cwd, env and user must be valid text without NUL characters")
    limit = config.max_tool_timeout_s
    if timeout_s is None:
        timeout = min(config.tool_timeout_s, limit)
    elif isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool) and math.isfinite(timeout_s) \
            and timeout_s > 0:
        timeout = min(float(timeout_s), limit)
    else:
        raise InvalidActionError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
    if output_cap is None:
        cap = config.output_cap_bytes
    elif isinstance(output_cap, int) and not isinstance(output_cap, bool) and 1 <= output_cap <= 1 << 30:
        cap = output_cap
    else:
        raise InvalidActionError(f"output_cap must be an int from 1 to 2**30, not {output_cap!r}")
    return ExecRequest(argv=argv, cwd=cwd, env=env, user=user, timeout_s=timeout, output_cap=cap)


def _ms_since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


__all__ = ["HostEnvironment"]
