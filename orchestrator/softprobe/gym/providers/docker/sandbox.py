"""One episode container: the channel to its shim, copying out, committing and removing it."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions
import urllib3.exceptions

from softprobe.gym.errors import (
    CheckpointTooLargeError,
    DockerUnavailableError,
    LiveCheckpointError,
    SandboxError,
    SandboxLostError,
)
from softprobe.gym.providers.archive import safe_extract
from softprobe.gym.providers.base import MAX_CHANGED_OUTSIDE, WORKSPACE, LiveRestore, Sandbox
from softprobe.gym.providers.docker import live
from softprobe.gym.providers.docker.attach_channel import AttachChannel
from softprobe.gym.providers.docker.direct_channel import remove_folder
from softprobe.gym.providers.docker.engine import DockerEngine
from softprobe.gym.providers.docker.retry import control_plane
from softprobe.gym.providers.docker.snapshots import snapshot_container
from softprobe.gym.providers.docker.uids import EpisodeIds
from softprobe.gym.providers.docker.world import (
    WORLD_PROXY_IMAGE,
    WORLD_SERVICES,
    WorldBuilder,
    WorldContainers,
    service_images,
)
from softprobe.gym.results import SkippedMember
from softprobe.gym.shim.client import MAX_LINE_BYTES, LineChannel
from softprobe.gym.worlds import EgressReport

#: How long asking the engine why a sandbox was lost may take before the loss is reported as is.
WHY_LOST_TIMEOUT_S = 10.0
#: How long a container whose shim's output ended is given to stop, so its exit (an OOM kill
#: above all) is on record before the loss is explained.
EXIT_WAIT_S = 3.0


class DockerSandbox(Sandbox):
    """A running episode container whose main process is the shim, reached over ``channel``.

    Args:
        engine: the engine it runs on.
        container_id / image_id: the container and the image it was created from.
        channel: the shim's stdin/stdout over attach, or its direct socket (``direct_channel.py``).
        user: the image user tools run as (kept in a flattened checkpoint's configuration).
        ids: the uids allocated to the episode; ``release(ids)`` is called once it is removed.
        pending_seed: seed files the shim extracts after its handshake, or None.
        channel_folder: the host folder of the container's socket, removed with it (or None).
        world: the world's other containers and network, removed and committed with it.
        builder: what manages ``world``.
    """

    def __init__(
        self,
        engine: DockerEngine,
        container_id: str,
        image_id: str,
        channel: LineChannel,
        user: str | None,
        ids: EpisodeIds,
        release: Callable[[EpisodeIds], None],
        pending_seed: bytes | None = None,
        world: WorldContainers | None = None,
        builder: WorldBuilder | None = None,
        channel_folder: str | None = None,
    ) -> None:
        self._engine = engine
        self.sandbox_id = container_id
        self.image_id = image_id
        self.channel = channel
        self.pending_seed = pending_seed
        self.ids = ids
        self._user = user
        self._release = release
        self._removed = False
        self.world = world
        self._builder = builder
        self._channel_folder = channel_folder
        #: Started from a live checkpoint once already (a restored child, or a parent that went
        #: on in place): containerd 1.6 refuses to restore such a container in place again.
        self.restored = False

    async def egress_report(self) -> EgressReport | None:
        if self.world is None or self.world.proxy is None or self._builder is None:
            return None
        return EgressReport.model_validate(await self._engine.run(self._builder.egress_log, self.world))

    async def configure_http_tape(self, control: bytes) -> bool:
        if self.world is None or self.world.proxy is None or self._builder is None:
            return False
        return await self._engine.run(self._builder.configure_proxy, self.world, control)

    async def http_journal(self, since: int) -> bytes | None:
        if self.world is None or self.world.proxy is None or self._builder is None:
            return None
        return await self._engine.run(self._journal_since, since)

    def _journal_since(self, since: int) -> bytes:
        assert self.world is not None and self._builder is not None
        # A stat first: most steps make no request, and copying the file out costs far more.
        if self._builder.journal_size(self.world) <= since:
            return b""
        return self._builder.read_journal(self.world)[since:]

    async def why_lost(self, reason: str, *, stream_ended: bool = False) -> str:
        """``reason``, plus what the engine knows: a container the kernel OOM-killed as a whole
        (under gVisor a memory bomb takes the whole sandbox, not one process), or an engine that
        does not answer (it stopped or restarted: its containers die with it). One question,
        bounded in time, never retried: the caller is waiting to report the loss. Where the
        shim's output ended, a container still running gets :data:`EXIT_WAIT_S` to stop first."""
        wait_s = EXIT_WAIT_S if stream_ended else 0
        try:
            state = await asyncio.wait_for(
                self._engine.run(self._engine.container_state, self.sandbox_id, retry=False, exit_wait_s=wait_s),
                WHY_LOST_TIMEOUT_S)
        except (DockerUnavailableError, asyncio.TimeoutError):
            return (f"{reason}; the Docker engine does not answer: it stopped or restarted, and its "
                    "containers die with it (unless it runs with live-restore)")
        except Exception:  # the container may be gone already; the original reason stands
            return reason
        if state.get("OOMKilled"):
            return (f"{reason}; the container ran out of memory and was killed as a whole (raise "
                    "container memory, or expect this for memory bombs under gVisor)")
        return reason

    async def copy_out(
        self, path: str, destination: Path, *, byte_budget: int | None = None
    ) -> list[SkippedMember]:
        return await self._engine.run(self._copy_out, path, destination, byte_budget)

    def _copy_out(self, path: str, destination: Path, byte_budget: int | None) -> list[SkippedMember]:
        api = self._engine.api
        try:
            stream, _ = control_plane(api.get_archive)(self.sandbox_id, path)
        except docker.errors.APIError as err:
            raise SandboxError(f"copying {path} out of the container failed: {err}") from None
        # Extracted as it arrives: never spooled, so the budget bounds what the host stores, and
        # a budget reached early stops the transfer (closing the stream drops the connection).
        try:
            # A RawIOBase, which tarfile reads like any binary file (short reads included); typeshed
            # has RawIOBase.read return bytes | None (None: non-blocking, never here), not BinaryIO's bytes.
            return safe_extract(_ChunkReader(stream), destination, byte_budget=byte_budget)  # type: ignore[arg-type]
        except (tarfile.TarError, requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as err:
            raise SandboxError(f"copying {path} out of the container failed: {err}") from None
        finally:
            stream.close()

    async def changed_outside_workspace(self) -> list[str] | None:
        return await self._engine.run(self._changed_outside)

    def _changed_outside(self) -> list[str]:
        """``docker diff``'s changed and added paths, but those in the workspace or a mount (the
        ``/tmp`` tmpfs, volumes: not in the layer a commit makes), sorted, at most
        MAX_CHANGED_OUTSIDE + 1 (the shim measures their holes)."""
        api = self._engine.api
        config = control_plane(api.inspect_container)(self.sandbox_id)
        mounts = [WORKSPACE, *((config.get("HostConfig") or {}).get("Tmpfs") or {}),
                  *(m.get("Destination") or "" for m in config.get("Mounts") or [])]
        tops = [m.rstrip("/") for m in mounts if m.startswith("/") and m.rstrip("/")]
        changes = control_plane(api.diff)(self.sandbox_id) or []
        paths = sorted(c["Path"] for c in changes if c.get("Kind") in (0, 1) and isinstance(c.get("Path"), str)
                       and not any(c["Path"] == top or c["Path"].startswith(top + "/") for top in tops))
        return paths[:MAX_CHANGED_OUTSIDE + 1]

    def commit_image(
        self, labels: dict[str, str], max_bytes: int | None, flatten_at_layers: int, pause_services: bool = True
    ) -> str:
        """Commit the container (and its world's services) as an image carrying ``labels``
        (blocking); a chain of ``flatten_at_layers`` layers is flattened instead. See
        :meth:`Provider.commit`. ``pause_services=False``: the services are stopped already."""
        if max_bytes is not None:
            self._check_size(max_bytes)
        if self.world is None or not (self.world.services or self.world.proxy_image) or self._builder is None:
            return self._commit_agent(labels, flatten_at_layers)
        services = self._builder.commit_services(self.world, labels, flatten_at_layers, pause=pause_services)
        try:
            world_labels = {WORLD_SERVICES: json.dumps(services, sort_keys=True)}
            if self.world.proxy_image:
                world_labels[WORLD_PROXY_IMAGE] = self.world.proxy_image
            return self._commit_agent({**labels, **world_labels}, flatten_at_layers)
        except BaseException:
            self._builder.remove_images(services.values())
            raise

    async def live_checkpoint(
        self, labels: dict[str, str], folder: Path, name: str, max_bytes: int | None, flatten_at_layers: int
    ) -> tuple[str, LiveRestore]:
        """See :meth:`Provider.live_checkpoint`. Each container is checkpointed and stopped
        (the episode container first: nothing else is touched if it is refused, then the
        services), so its files stay what they were at its checkpoint; the stopped containers
        are committed, the checkpoint files copied into ``folder``, and every container
        started again from its own checkpoint."""
        run, api = self._engine.run, self._engine.api
        if self.restored:
            raise LiveCheckpointError(
                "this episode's container was started from a live checkpoint already (a restored child, or a "
                "parent that went on after its live checkpoint), and containerd refuses to restore a container in "
                "place a second time ('content ... already exists', then 'id already in use'): nothing was done. "
                "Fork it (checkpoint_import of the live checkpoint) and checkpoint the fresh child, or take a "
                "container-scope checkpoint (scope=None)"
            )
        if max_bytes is not None:
            await run(self._check_size, max_bytes)
        root = await run(live.data_root, api)
        services = dict(self.world.services) if self.world is not None and self._builder is not None else {}
        members = [("agent", self.sandbox_id), *((f"services/{n}", cid) for n, cid in services.items())]
        stopped: list[str] = []
        image_id: str | None = None
        try:
            try:
                for _, container_id in members:
                    await run(live.create, api, container_id, name)
                    stopped.append(container_id)
                image_id = await run(self.commit_image, {**labels, live.LIVE_CHECKPOINT: name}, None,
                                     flatten_at_layers, False)
                for role, container_id in members:
                    await run(live.copy_out, root, container_id, name, folder / role)
            finally:
                await self._resume(stopped, name)
        except BaseException:
            await run(shutil.rmtree, folder, True)
            if image_id is not None:
                await run(self._remove_live_image, image_id)
            raise
        ids = self.ids
        return image_id, LiveRestore(folder=folder, name=name, services=tuple(services),
                                     agent_ids=(ids.agent_uid, ids.agent_gid, ids.tool_uid, ids.tool_gid))

    async def _resume(self, stopped: list[str], name: str) -> None:
        """Start the checkpointed containers again from their checkpoints (the episode's own
        with a new attach channel), then drop the checkpoints from the engine.

        Raises:
            SandboxLostError: a container could not be brought back.
        """
        run, api = self._engine.run, self._engine.api
        try:
            for container_id in stopped:
                if container_id != self.sandbox_id:
                    await run(live.start, api, container_id, name)
            if self.sandbox_id in stopped:
                self.channel.close()
                self.channel = await attach_restored(self._engine, self.sandbox_id, name)
                self.restored = True
        except Exception as err:
            raise SandboxLostError(f"the sandbox could not be started again from its live checkpoint: {err}") from err
        finally:
            for container_id in stopped:
                try:
                    await run(live.delete, api, container_id, name)
                except Exception:  # noqa: S110 - removed with its container anyway
                    pass

    def _remove_live_image(self, image_id: str) -> None:
        labels = (control_plane(self._engine.api.inspect_image)(image_id).get("Config") or {}).get("Labels") or {}
        if self._builder is not None:
            self._builder.remove_images([image_id, *service_images(labels).values()])

    def _commit_agent(self, labels: dict[str, str], flatten_at_layers: int) -> str:
        # No pause: commit only happens between steps, when no tool process is alive to write.
        return snapshot_container(self._engine.api, self.sandbox_id, self.image_id, labels,
                                  flatten_at_layers=flatten_at_layers, user=self._user, pause=False)

    def _check_size(self, max_bytes: int) -> None:
        """Refuse a commit whose layer would exceed ``max_bytes``. Docker's ``SizeRw`` is the
        apparent size of the container's changes: what ``docker commit`` copies into the layer."""
        api = self._engine.api
        # A world's services are committed with the agent, so their changes count too (an agent
        # may well make a service write without bound).
        ids = [self.sandbox_id, *(self.world.services.values() if self.world is not None else ())]
        size = 0
        for container_id in ids:
            listed = control_plane(api.containers)(all=True, filters={"id": container_id}, size=True)
            size += int((listed[0].get("SizeRw") if listed else 0) or 0)
        if size > max_bytes:
            what = "the world's containers'" if len(ids) > 1 else "the container's"
            raise CheckpointTooLargeError(
                f"{what} filesystem changes are {size} bytes, over the checkpoint budget "
                f"of {max_bytes} bytes (checkpoint_budget_bytes); nothing was committed. Delete "
                "large files first (sparse files count at their full length), or raise the budget.",
                size_bytes=size,
                budget_bytes=max_bytes,
            )

    def _remove_container(self) -> None:
        """Remove the container, then its channel folder on this host (blocking; the folder stays
        while its container does: it is the container's mount source)."""
        self._engine.remove_container(self.sandbox_id)
        remove_folder(self._channel_folder)

    async def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        self.channel.close()
        try:
            # One call on the engine's thread: a cancelled caller cannot leave the folder behind.
            await asyncio.shield(self._engine.run(self._remove_container))
        finally:
            try:
                if self.world is not None and self._builder is not None:
                    await asyncio.shield(self._engine.run(self._builder.remove, self.world))
            finally:
                self._release(self.ids)


#: How often a restore that containerd refused with "content ... already exists" is tried.
RESTORE_ATTEMPTS = 6


async def attach_restored(engine: DockerEngine, container_id: str, name: str) -> AttachChannel:
    """Attach to ``container_id`` and start it from its checkpoint ``name``; the channel to its
    restored shim. Attached before the start, as every start is, and again before each retry
    (a failed start ends the attach stream).

    Raises:
        SandboxError: the restore failed (after ``RESTORE_ATTEMPTS`` tries).
    """
    api = engine.api
    for attempt in range(RESTORE_ATTEMPTS):
        if attempt:
            await asyncio.sleep(0.1 * 2 ** (attempt - 1))  # a bounded backoff: containerd lets go in its time
        attach = await engine.run(control_plane(api.attach_socket), container_id,
                                  params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        try:
            channel = await AttachChannel.open(attach, max_line_bytes=MAX_LINE_BYTES)
        except BaseException:
            getattr(attach, "close", lambda: None)()
            raise
        try:
            if await engine.run(live.start_once, api, container_id, name):
                return channel
        except BaseException:
            channel.close()
            raise
        channel.close()
    raise SandboxError(f"the restore of container {container_id[:12]} from its live checkpoint kept failing with "
                       "containerd's 'content ... already exists'")


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (Docker's archive stream)."""

    def __init__(self, chunks: Any) -> None:
        self._chunks = iter(chunks)
        self._chunk = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._chunk:
            try:
                self._chunk = memoryview(next(self._chunks))
            except StopIteration:
                return 0
        count = min(len(buffer), len(self._chunk))
        buffer[:count] = self._chunk[:count]
        self._chunk = self._chunk[count:]
        return count


__all__ = ["DockerSandbox"]
