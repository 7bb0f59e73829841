"""A sandbox with a live shim: what the host steps, whatever provider runs the sandbox.

:meth:`Runtime.start` asks a provider for a sandbox, completes the shim's handshake over the
sandbox's channel (checking that the shim is this library's own program), installs the world's
added tools (its :class:`~softprobe.gym.worlds.ToolOverlay`) and extracts the seed; after that
every tool call, check and copy goes through the runtime.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from softprobe.gym.actions import ToolAction
from softprobe.gym.errors import ConfigurationError, SandboxLostError, SandboxStartError
from softprobe.gym.providers.archive import build_overlay_archive
from softprobe.gym.providers.base import WORKSPACE, LiveRestore, Provider, Sandbox, SandboxSpec
from softprobe.gym.results import ProcessResult, SkippedMember
from softprobe.gym.shim import SHIM_SHA256
from softprobe.gym.shim.client import ShimClient, ShimRefusedError
from softprobe.gym.shim.protocol import (
    ApplyChangesResult,
    CallResult,
    ExecRequest,
    ExportChangesResult,
    HelloResult,
    PutFilesRequest,
    PutFilesResult,
    RescanResult,
    VerifyRequest,
    VerifyResult,
    WorkspaceSnapshotRequest,
    WorkspaceSnapshotResult,
    WorkspaceStageRequest,
)
from softprobe.gym.tracing import SpanHandle
from softprobe.gym.worlds import ToolOverlay

#: What an overlay request carries: manifest entries by tool name, the files as a tar, and the
#: MCP servers' manifest entries.
OverlayPayload = tuple[dict[str, dict[str, Any]], bytes, list[dict[str, Any]]]

#: How long a new sandbox's shim may take to answer its first request.
HELLO_TIMEOUT_S = 60.0


class Runtime:
    """One started sandbox and the shim client talking to it. Calls are served one at a time.

    Attributes:
        provider: the provider that started the sandbox.
        sandbox: the provider's handle.
        hello: the shim's latest handshake (tools, workspace digest and files).
    """

    def __init__(self, provider: Provider, sandbox: Sandbox, client: ShimClient, hello: HelloResult) -> None:
        self.provider = provider
        self.sandbox = sandbox
        self.hello = hello
        self._client = client
        self._removed = False

    @property
    def channel(self) -> str:
        """What carries the shim's requests now (``attach``, ``direct``, ``pipe``: see
        :class:`~softprobe.gym.shim.client.LineChannel`; ``unknown`` for a provider's channel
        that does not say)."""
        return str(getattr(self.sandbox.channel, "kind", "unknown"))

    @classmethod
    async def start(cls, provider: Provider, spec: SandboxSpec) -> Runtime:
        """Start a sandbox of ``spec`` on ``provider`` and bring its shim up.

        Every start (cold, for the warm pool, from a checkpoint's image) installs the tools of
        ``spec.world`` right after the handshake, before the seed: a sandbox always offers its
        world's tools. Nothing of a sandbox that did not come up stays behind: its connection
        and the sandbox are removed before the error is raised.

        Raises:
            ConfigurationError: the world's tools cannot be installed: ``files_root`` holds a
                link leading out (before any sandbox starts), or a tool's name is one the image
                declares already (the message names the tool).
            ImageNotFoundError: the image is not where the provider runs.
            SandboxStartError: the shim did not answer, or is not this library's program.
            SandboxError: the provider failed.
        """
        overlay = await overlay_payload(spec.world.tools)
        sandbox = await provider.start(spec)
        client = ShimClient(sandbox.channel)
        try:
            hello = await client.hello(timeout_s=HELLO_TIMEOUT_S)
            if hello.shim_sha256 != SHIM_SHA256:
                raise SandboxStartError(
                    f"the shim in a sandbox of {spec.image!r} is not this library's (sha256 "
                    f"{hello.shim_sha256[:12] or 'unknown'}, expected {SHIM_SHA256[:12]}); rebuild the "
                    "image with `softprobe-gym images build`"
                )
            runtime = cls(provider, sandbox, client, hello)
            # A live restore's shim has its world's tools already (they are in its memory).
            if overlay is not None and spec.live is None:
                await runtime._install_overlay(overlay, spec.image)
            if sandbox.pending_seed is not None:
                await runtime.seed_archive(sandbox.pending_seed)
        except BaseException as err:
            client.close()
            await asyncio.shield(sandbox.remove())
            if isinstance(err, SandboxLostError):
                raise SandboxStartError(
                    f"the shim in a sandbox of {spec.image!r} did not start: {err}. The image needs "
                    "python3 (>= 3.8) on PATH and a /bin/sh."
                ) from None
            raise
        return runtime

    async def _install_overlay(self, payload: OverlayPayload, image: str) -> None:
        tools, archive, mcp_servers = payload
        try:
            self.hello = await self._client.overlay(tools, archive, mcp_servers)
        except ShimRefusedError as err:
            if err.kind == "tool_conflict":
                raise ConfigurationError(
                    f"the world's tools cannot be added to a sandbox of {image!r}: {err.detail}; rename the "
                    "added tool (a tool's name must be unique among built-in, image and added tools)"
                ) from None
            if err.kind == "invalid_tool":
                raise ConfigurationError(
                    f"the world's tools cannot be added to a sandbox of {image!r}: {err.detail}"
                ) from None
            raise SandboxStartError(
                f"the shim in a sandbox of {image!r} refused the world's tools: {err.detail}"
            ) from None

    @property
    def sandbox_id(self) -> str:
        """The provider's id of the sandbox (a container id for Docker)."""
        return self.sandbox.sandbox_id

    @property
    def image_id(self) -> str:
        """The id of the image the sandbox was started from."""
        return self.sandbox.image_id

    @property
    def lost(self) -> str | None:
        """Why the sandbox stopped working, or None while it works."""
        return "the sandbox was removed" if self._removed else self._client.lost

    async def _explained(self, err: SandboxLostError) -> SandboxLostError:
        """``err`` with what the provider knows about why the sandbox was lost."""
        reason = await self.sandbox.why_lost(str(err), stream_ended=err.stream_ended)
        return SandboxLostError(reason, stream_ended=err.stream_ended)

    async def call_tool(
        self, *, tool: str, args: dict[str, Any], timeout_s: float, output_cap: int, traceparent: str | None = None
    ) -> CallResult:
        """Run one tool and return its result. Never retried: a tool may have had effects.

        Args:
            tool: the tool name.
            args: its JSON arguments.
            timeout_s: the tool's processes are killed after this long; the result then carries
                a ``timeout`` error.
            output_cap: bytes of output kept; the rest is cut around a visible marker.
            traceparent: a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``) the shim puts
                into ``TRACEPARENT`` of the processes the call starts; None: none.

        Raises:
            SandboxLostError: the sandbox or shim died, or no answer came within ``timeout_s``
                plus a grace period (with what the provider knows about why). The runtime is
                unusable afterwards.
        """
        try:
            return await self._client.call_tool(
                tool=tool, args=args, timeout_s=timeout_s, output_cap=output_cap, traceparent=traceparent
            )
        except SandboxLostError as err:
            raise await self._explained(err) from None

    async def run_process(self, request: ExecRequest, stdin: bytes) -> ProcessResult:
        """Run one program for the host as a user of the sandbox (see :class:`ExecRequest`:
        None is the agent, root is the caller's to trust); never retried. What
        ``HostEnvironment.run_process`` and a Harbor environment's commands use.

        Raises:
            SandboxLostError: as for :meth:`call_tool`.
            ShimRefusedError: the shim refused the request (``invalid_arguments``,
                ``unknown_user``).
        """
        try:
            reply = await self._client.exec(request, stdin)
        except SandboxLostError as err:
            raise await self._explained(err) from None
        code = reply.exit_code
        return ProcessResult(
            returncode=None if code is None else (128 - code if code < 0 else code),
            signal=-code if code is not None and code < 0 else None,
            stdout=base64.b64decode(reply.stdout),
            stderr=base64.b64decode(reply.stderr),
            stdout_bytes=reply.stdout_bytes,
            stderr_bytes=reply.stderr_bytes,
            error=reply.error,
            spawn_error=reply.spawn_error,
            duration_ms=reply.command_ms,
            workspace_digest=reply.workspace_digest,
            changed_paths=reply.changed_paths,
        )

    async def export_changes(self, *, max_bytes: int) -> ExportChangesResult:
        """The final state of the paths the last :meth:`call_tool` changed (a tape's change set).

        Raises:
            SandboxLostError: as for :meth:`call_tool`.
            ShimRefusedError: the shim refused the request.
        """
        try:
            return await self._client.export_changes(max_bytes=max_bytes)
        except SandboxLostError as err:
            raise await self._explained(err) from None

    async def apply_changes(self, changes: list[dict[str, Any]]) -> ApplyChangesResult:
        """Apply a recorded change set to the workspace (checked by the shim: the set is untrusted).

        Raises:
            SandboxLostError: as for :meth:`call_tool`.
            ShimRefusedError: the set was refused (kind ``change_set_refused``); nothing changed.
        """
        try:
            return await self._client.apply_changes(changes)
        except SandboxLostError as err:
            raise await self._explained(err) from None

    async def set_episode_env(self, *, clock_start: int | None, random_seed: int | None) -> HelloResult:
        """Fix the clock start (epoch seconds; needs ``"time_shim"`` in ``hello.capabilities``)
        and the random seed of every process this sandbox's shim starts from now on. Once, before
        the first call; returns the new hello.

        Raises:
            SandboxError: the shim refused (no time shim, or a call was already made).
            SandboxLostError: as for :meth:`call_tool`.
        """
        self.hello = await self._client.episode_env(clock_start=clock_start, random_seed=random_seed)
        return self.hello

    async def seed(self, seed_root: Path | None) -> HelloResult:
        """Copy ``seed_root`` into the workspace of this started sandbox; return the new hello.

        Used on sandboxes started without seed files (the warm pool).
        """
        if seed_root is None:
            return self.hello
        archive = await self.provider.seed_archive(self.sandbox, seed_root)
        return self.hello if archive is None else await self.seed_archive(archive)

    async def close_sessions(self) -> list[str]:
        """Close every persistent session of the episode (``session.start``): their processes
        are killed. Returns the names of those closed.

        Raises:
            SandboxLostError: as for :meth:`call_tool`.
        """
        return await self._client.close_sessions()

    async def ping(self) -> HelloResult:
        """Ask the shim for its hello again (one round trip): a sandbox that died while idle
        raises SandboxLostError here rather than at its first call."""
        self.hello = await self._client.hello(timeout_s=HELLO_TIMEOUT_S)
        return self.hello

    async def seed_archive(self, archive: bytes) -> HelloResult:
        """Have the shim extract ``archive`` (names relative to the workspace)."""
        self.hello = await self._client.seed(archive)
        return self.hello

    async def rescan(self) -> str:
        """The workspace digest from a full walk, after every process but the shim is gone.

        What ``finalize`` and ``checkpoint`` record: it trusts no incremental tracking.

        Raises:
            SandboxLostError: as for :meth:`call_tool`.
        """
        return (await self.scan()).workspace_digest

    async def scan(self, *, zero_paths: list[str] | None = None) -> RescanResult:
        """As :meth:`rescan`, with what the walk found beside the digest (the zeros in whole
        blocks a checkpoint would write out); with ``zero_paths`` (absolute paths outside the
        workspace), the holes of those files too (``outside_zeros``).

        Raises:
            SandboxLostError: as for :meth:`call_tool`.
        """
        return await self._client.rescan(zero_paths)

    async def workspace_snapshot(self, request: WorkspaceSnapshotRequest) -> WorkspaceSnapshotResult:
        """One chunk of the workspace's snapshot: the first (after every process but the shim is
        gone and a full scan) carries the manifest; ask again with ``resume`` while ``more``.

        Raises:
            ShimRefusedError: ``workspace_unsupported`` (a special file, a hard link, a name that
                is not UTF-8), ``over_budget`` or ``processes_survive``.
            SandboxLostError: as for :meth:`call_tool`.
        """
        try:
            return await self._client.workspace_snapshot(request)
        except SandboxLostError as err:
            raise await self._explained(err) from None

    async def workspace_stage(self, request: WorkspaceStageRequest, data: bytes) -> None:
        """Stage pieces of blobs for :meth:`workspace_restore` (``data``: their content, one
        after the other).

        Raises:
            ShimRefusedError: a piece was refused (out of order, or a blob does not match its
                name); SandboxLostError: as for :meth:`call_tool`.
        """
        try:
            await self._client.workspace_stage(request, data)
        except SandboxLostError as err:
            raise await self._explained(err) from None

    async def workspace_restore(self, changes: list[dict[str, Any]]) -> HelloResult:
        """Make the workspace exactly ``changes`` (an apply_changes set); returns the new hello.

        Raises:
            ShimRefusedError: the set was refused; SandboxLostError: as for :meth:`call_tool`.
        """
        try:
            self.hello = await self._client.workspace_restore(changes)
        except SandboxLostError as err:
            raise await self._explained(err) from None
        return self.hello

    async def put_files(self, request: PutFilesRequest, archive: bytes) -> PutFilesResult:
        """Place a tar of folders and files into a folder of the sandbox as a user (see
        :class:`PutFilesRequest`); never retried.

        Raises:
            ShimRefusedError: the archive was refused (a member leaving the folder, a link;
                ``files_refused``: a link or file of the sandbox in the way), nothing written;
                ``unknown_user``: no such user.
            SandboxLostError: as for :meth:`call_tool`.
        """
        try:
            return await self._client.put_files(request, archive)
        except SandboxLostError as err:
            raise await self._explained(err) from None

    async def verify(self, request: VerifyRequest, archive: bytes) -> VerifyResult:
        """Run a world's verifier in the sandbox (see :class:`VerifyRequest`).

        Raises:
            ShimRefusedError: the request was refused (a path overlapping the workspace).
            SandboxLostError: as for :meth:`call_tool`.
        """
        try:
            return await self._client.verify(request, archive)
        except SandboxLostError as err:
            raise await self._explained(err) from None

    async def exists(self, path: str) -> bool:
        """Whether ``path`` (relative to the workspace) exists. Raises SandboxLostError."""
        return await self._client.exists(path)

    async def read_text(self, path: str, *, max_bytes: int = 1 << 20) -> str:
        """The first ``max_bytes`` of a workspace file as text (invalid UTF-8 replaced).

        Raises:
            SandboxError: the file does not exist or is outside the workspace.
            SandboxLostError: as for :meth:`call_tool`.
        """
        return await self._client.read_text(path, max_bytes=max_bytes)

    async def copy_out_workspace(self, destination: Path, *, byte_budget: int | None = None) -> list[SkippedMember]:
        """Copy the workspace to ``destination/workspace``; see :meth:`Sandbox.copy_out`."""
        return await self.sandbox.copy_out(WORKSPACE, destination, byte_budget=byte_budget)

    async def commit(self, *, labels: dict[str, str], max_bytes: int | None = None) -> str:
        """Snapshot the sandbox as an image; see :meth:`Provider.commit`."""
        return await self.provider.commit(self.sandbox, labels=labels, max_bytes=max_bytes)

    async def live_checkpoint(
        self, *, labels: dict[str, str], folder: Path, name: str, max_bytes: int | None = None
    ) -> tuple[str, LiveRestore]:
        """Save the sandbox's processes and memory with its filesystem; see
        :meth:`Provider.live_checkpoint`. The shim goes on in place, over a new channel: its
        hello is asked for again (the restored process answers it).

        Raises:
            LiveCheckpointError / CheckpointTooLargeError: nothing was kept; the sandbox goes on.
            SandboxLostError: the sandbox could not be brought back (the runtime is unusable).
        """
        channel = self.sandbox.channel
        try:
            return await self.provider.live_checkpoint(
                self.sandbox, labels=labels, folder=folder, name=name, max_bytes=max_bytes)
        finally:
            if self.sandbox.channel is not channel:
                self._client.close()
                self._client = ShimClient(self.sandbox.channel)
                self.hello = await self._client.hello(timeout_s=HELLO_TIMEOUT_S)

    async def remove(self) -> None:
        """Close the connection and remove the sandbox. Idempotent."""
        if self._removed:
            return
        self._removed = True
        self._client.close()
        await asyncio.shield(self.sandbox.remove())


async def overlay_payload(overlay: ToolOverlay) -> OverlayPayload | None:
    """The shim's ``overlay`` request for ``overlay`` (None when it adds nothing).

    Raises:
        ConfigurationError: ``files_root`` holds a link leading out, or a special file.
    """
    if overlay.empty:
        return None
    tools = {tool.name: tool.manifest_entry() for tool in overlay.tools}
    servers = [server.manifest_entry() for server in overlay.mcp_servers]
    if overlay.files_root is None:
        return tools, b"", servers
    try:
        archive = await asyncio.to_thread(build_overlay_archive, overlay.files_root)
    except OSError as err:
        raise ConfigurationError(f"tool_files {overlay.files_root} cannot be read: {err}") from None
    return tools, archive, servers


@dataclass(frozen=True)
class CallRequest:
    """One step's tool call, as it goes down the episode's :class:`StepCall` chain.

    Attributes:
        action: the tool and its arguments.
        step: the step's index (1-based).
        timeout_s: the call's time limit (a ``shell.exec`` may have asked for its own).
        workspace_digest: the workspace's digest before the call.
        span: the step's span (its ``traceparent`` goes to the call's processes).
        on_lost: marks the episode broken when the sandbox is lost, and returns the error to raise.
    """

    action: ToolAction
    step: int
    timeout_s: float
    workspace_digest: str
    span: SpanHandle
    on_lost: Callable[[SandboxLostError], Awaitable[BaseException]]


class StepCall(Protocol):
    """What a step calls to run its tool: the runtime (:class:`RuntimeCall`), wrapped once per
    attempt by what the attempt needs (the tape, the HTTP tape: see
    :func:`softprobe.gym.tapes.calls.step_call`). A wrapper holds the call it wraps and calls it
    at most once per request; it may answer without it (a replayed call)."""

    async def __call__(self, request: CallRequest) -> CallResult:
        """The call's result.

        Raises:
            BaseException: what ``request.on_lost`` returned, when the sandbox was lost; a
                wrapper's own errors are the step's (never raised for a tape: see the wrappers).
        """
        ...


class RuntimeCall:
    """The innermost :class:`StepCall`: the tool runs in the sandbox, through the shim."""

    def __init__(self, runtime: Runtime, *, output_cap: int) -> None:
        self.runtime = runtime
        self._output_cap = output_cap

    async def __call__(self, request: CallRequest) -> CallResult:
        """Run the tool (see :meth:`Runtime.call_tool`); add the shim's timings to the step's span.

        Raises:
            BaseException: what ``request.on_lost`` returns for a lost sandbox.
        """
        try:
            call = await self.runtime.call_tool(
                tool=request.action.name, args=dict(request.action.args), timeout_s=request.timeout_s,
                output_cap=self._output_cap, traceparent=request.span.traceparent(),
            )
        except SandboxLostError as err:
            raise await request.on_lost(err) from err
        request.span.shim_timings(call.diagnostics, time.time_ns())
        call.diagnostics["channel"] = self.runtime.channel
        return call


__all__ = ["HELLO_TIMEOUT_S", "CallRequest", "Runtime", "RuntimeCall", "StepCall", "overlay_payload"]
