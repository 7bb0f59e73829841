"""The Docker provider: each sandbox a container with the shim as its main process.

Images are resolved (and their user looked up) once; seeds go in by one archive before start,
or, when small, through the shim after its handshake. Each episode gets uids of its own
(``uids.py``). Blocking calls run on the engine's thread pool (``engine.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tarfile
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
from docker.types import Ulimit

from softprobe.gym import labels as L
from softprobe.gym.errors import (
    ConfigurationError,
    ImageNotFoundError,
    LiveCheckpointUnavailableError,
    SandboxError,
)
from softprobe.gym.providers.archive import build_seed_archive
from softprobe.gym.providers.base import WORKSPACE, LiveRestore, Provider, Sandbox, SandboxSpec, SweepReport
from softprobe.gym.providers.docker import live
from softprobe.gym.providers.docker.attach_channel import AttachChannel
from softprobe.gym.providers.docker.direct_channel import (
    CONTAINER_SOCKET,
    ChannelListener,
    channel_enabled,
    direct_channel_problem,
    remove_folder,
    sweep_folders,
    upgrade,
)
from softprobe.gym.providers.docker.engine import DockerEngine
from softprobe.gym.providers.docker.errors import ENGINE_ERRORS, translate
from softprobe.gym.providers.docker.retry import control_plane
from softprobe.gym.providers.docker.sandbox import DockerSandbox, attach_restored
from softprobe.gym.providers.docker.uids import EpisodeIds, UidAllocator
from softprobe.gym.providers.docker.world import (
    NO_UPSTREAM_DNS,
    WORLD_PROXY_IMAGE,
    WorldBuilder,
    WorldContainers,
    proxy_environment,
    service_images,
)
from softprobe.gym.settings import ContainerSettings, parse_size
from softprobe.gym.shim import SHIM_ARTEFACT, SHIM_SHA256, shim_source
from softprobe.gym.shim.client import MAX_LINE_BYTES, LineChannel
from softprobe.gym.worlds import World

#: Where a container has the shim: its artefact (a zip application, see softprobe.gym.shim).
SHIM_PATH = "/opt/softprobe/" + SHIM_ARTEFACT
#: overlay2 refuses more than ~125 layers; a commit that would reach this many flattens instead.
FLATTEN_AT_LAYERS = 100
#: Seeds up to this size are sent through the shim; larger ones by archive before start.
SEED_BY_SHIM_MAX = 8 * 1024 * 1024
NOBODY = 65534
_SHIM_SOURCE = shim_source()
log = logging.getLogger("softprobe.gym.docker")


@dataclass(frozen=True)
class _ImageInfo:
    image_id: str
    user: str | None
    uid: int
    gid: int
    shim_baked: bool
    services: dict[str, str]  # a world checkpoint's service images, by service name
    proxy_image: str  # what a world's egress proxy runs from: the original image, not a snapshot


class DockerProvider(Provider):
    """Runs each sandbox as a Docker container with the shim as its main process.

    Args:
        docker_host: engine address; default as in :func:`connect_docker`.
        max_workers: threads for blocking Docker calls (also the HTTP connection pool size), so
            that many episodes can start, copy and stop at once.
        egress_network: the network through which the egress proxy of a world under network
            mode ``egress`` reaches the allowed destinations (default ``bridge``: the outside).
        service_start_timeout_s: how long a world's services may take to become healthy.
        direct_channel: reach each shim over a unix socket of the host's own instead of
            Docker's attach relay, where the engine is local Linux and the runtime is not gVisor
            (see ``direct_channel.py``); ``None``: on unless ``SOFTPROBE_GYM_CHANNEL=attach``.
            Each step's diagnostics name the channel it took (``channel``).
    """

    name = "docker"
    supports_commit = True

    def __init__(
        self,
        *,
        docker_host: str | None = None,
        max_workers: int = 32,
        flatten_at_layers: int = FLATTEN_AT_LAYERS,
        egress_network: str = "bridge",
        service_start_timeout_s: float = 120.0,
        direct_channel: bool | None = None,
    ) -> None:
        self.engine = DockerEngine(docker_host=docker_host, max_workers=max_workers)
        self.worlds = WorldBuilder(self.engine, egress_network)
        self.service_start_timeout_s = service_start_timeout_s
        self.flatten_at_layers = flatten_at_layers
        self._image_info: dict[str, _ImageInfo] = {}
        self._uids = UidAllocator()
        self._seed_archives: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
        self.direct_channel = channel_enabled() if direct_channel is None else direct_channel
        self._engine_info: dict[str, Any] | None = None
        self._told: set[str] = set()  # why attach was used, logged once each

    @property
    def client(self) -> docker.DockerClient:
        """The engine's Docker client (connected on first use)."""
        return self.engine.client

    # -- settings ------------------------------------------------------------------------------

    def check_settings(self, settings: ContainerSettings) -> None:
        """Refuse settings this engine cannot honour (today: an unknown ``runtime``).

        Raises:
            ConfigurationError: the engine has no runtime by that name; the message says how to
                register one.
            DockerUnavailableError: no engine answers.
        """
        if settings.runtime is None:
            return
        runtimes = sorted((self.engine.info().get("Runtimes") or {}).keys())
        if settings.runtime not in runtimes:
            raise ConfigurationError(
                f"container runtime {settings.runtime!r} is not registered with this Docker engine "
                f"(it has: {', '.join(runtimes) or 'none'}). Register it in /etc/docker/daemon.json, "
                'e.g. {"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": '
                '["--network=none", "--overlay2=none"]}}} (Debian: apt-get install runsc), then '
                "restart dockerd; on Docker Desktop add the same under Settings > Docker Engine."
            )

    def check_world(self, world: World, settings: ContainerSettings) -> None:
        """Refuse a world this engine cannot run: services with a container network of their
        own, or under a runtime registered without networking.

        Raises:
            ConfigurationError: the message says what to change.
        """
        try:
            self.worlds.check(world, settings)
        except ENGINE_ERRORS as err:
            raise translate(err, "info") from err

    # -- start ---------------------------------------------------------------------------------

    async def start(self, spec: SandboxSpec) -> Sandbox:
        if not spec.world.has_containers:
            return await self._start_agent(spec, None)
        # The network first (every container of the world joins it), then the services, the
        # proxy and the agent's container all at once; the sandbox is returned when all are up.
        info = await self.engine.run(self._image_info_for, spec.image, spec.settings.user)
        egress = spec.world.network.mode == "egress"
        world = WorldContainers(network=await self.engine.run(self.worlds.create_network, spec.labels),
                                proxy_image=info.proxy_image if egress else None)
        deadline = time.monotonic() + self.service_start_timeout_s
        stop = threading.Event()
        services = asyncio.ensure_future(self.engine.run(
            self.worlds.start_services, spec.world, world.network, spec.labels, spec.settings, info.services,
            deadline, stop, spec.live))
        proxy = asyncio.ensure_future(self.engine.run(
            self.worlds.start_proxy, spec.world, info.proxy_image, world.network, spec.labels, deadline, stop
        )) if egress else None
        agent: asyncio.Future[Sandbox] = asyncio.ensure_future(self._start_agent(spec, world))
        parts: list[asyncio.Future[Any]] = [f for f in (services, proxy, agent) if f is not None]
        try:
            # Shielded: a cancelled start must still learn what each part made, to remove it
            # (a Docker call in a thread cannot be cancelled, only waited for).
            await asyncio.gather(*(asyncio.shield(part) for part in parts))
        except BaseException:
            stop.set()
            await asyncio.shield(self._abandon(world, parts))
            raise
        world.services.update(services.result())
        world.proxy = proxy.result() if proxy is not None else None
        return agent.result()  # a DockerSandbox made with ``world``, now complete

    async def _abandon(self, world: WorldContainers, parts: list[asyncio.Future[Any]]) -> None:
        """Remove what the parts of a failed world start made, once each has finished."""
        await asyncio.gather(*parts, return_exceptions=True)
        for part in parts:
            if part.cancelled() or part.exception() is not None:
                continue
            done = part.result()
            if isinstance(done, DockerSandbox):
                done.world = None  # removed below, once every member is known
                await done.remove()
            elif isinstance(done, dict):
                world.services.update(done)
            elif isinstance(done, str):
                world.proxy = done
        await self.engine.run(self.worlds.remove, world)

    async def _start_agent(self, spec: SandboxSpec, world: WorldContainers | None) -> Sandbox:
        info = await self.engine.run(self._image_info_for, spec.image, spec.settings.user)
        seed = spec.seed_root if spec.copy_seed else None
        # Small seeds travel through the shim after start (no extra Docker call); large ones,
        # and the shim itself for images that lack it, go in by one archive before start.
        archive, shim_seed = None, None
        if seed is not None:
            archive, shim_seed = await self.engine.run(self._prepare_seed, seed, info)
        # A checkpoint image's shim file is never trusted: the library's own is put over it.
        if archive is None and (not info.shim_baked or not spec.copy_seed):
            archive = build_seed_archive(
                None, uid=info.uid, gid=info.gid, extra={SHIM_PATH: _SHIM_SOURCE}, workspace=spec.copy_seed
            )
        elif archive is not None and not spec.copy_seed:
            raise SandboxError("a checkpoint image is started without seed files")
        # A live restore's shim runs tools as its parent's uids (they are in its memory): under
        # gVisor, the only runtime live checkpoints work on, each sandbox has a kernel of its own.
        restore = spec.live
        listener = await self._channel_listener(spec)  # before the uids: it may raise
        try:
            ids = EpisodeIds(*restore.agent_ids) if restore is not None else self._uids.allocate(spec.settings, info)
        except BaseException:
            if listener is not None:
                listener.close()
                remove_folder(listener.folder)
            raise
        release: Callable[[EpisodeIds], None] = self._uids.release if restore is None else _keep
        try:
            try:
                container_id, channel = await self._create_and_start(spec, info, ids, world, archive, listener)
            except _MountRefused as err:
                # An engine that cannot see this host's temp folder (a remote context, dockerd in
                # a VM or with a private /tmp), or an image with a file where the socket goes.
                self.direct_channel = False
                log.warning("the engine refused the direct channel's socket mount; this provider's shims stay on "
                            "attach from now on: %s", err)
                listener = None
                container_id, channel = await self._create_and_start(spec, info, ids, world, archive, None)
        except BaseException:
            release(ids)  # nothing of a sandbox that did not start may stay: its uids neither
            raise
        sandbox = DockerSandbox(self.engine, container_id, info.image_id, channel, info.user, ids, release,
                                pending_seed=shim_seed, world=world, builder=self.worlds,
                                channel_folder=listener.folder if listener is not None else None)
        sandbox.restored = restore is not None
        return sandbox

    async def _create_and_start(
        self, spec: SandboxSpec, info: _ImageInfo, ids: EpisodeIds, world: WorldContainers | None,
        archive: bytes | None, listener: ChannelListener | None,
    ) -> tuple[str, LineChannel]:
        """Create and start the agent's container and open the channel to its shim; on failure
        remove what it made (the container, the listener's folder).

        Raises:
            _MountRefused: the engine refused the container with ``listener``'s socket mounted.
        """
        restore = spec.live
        try:
            try:
                container_id = await self.engine.run(self._create, spec, info, ids, world, listener)
            except SandboxError as err:
                if _names_the_mount(err, listener):
                    raise _MountRefused(str(err)) from err
                raise
        except BaseException:
            if listener is not None:
                listener.close()
                remove_folder(listener.folder)
            raise
        try:
            if archive is not None:
                await self.engine.run(self._put_archive, container_id, archive)
            if restore is not None:  # the shim's process and memory from the live checkpoint
                await self.engine.run(self._place_live, container_id, restore)
                channel: LineChannel = await attach_restored(self.engine, container_id, restore.name)
            else:
                attach = await self.engine.run(self._attach, container_id)
                try:
                    channel = await AttachChannel.open(attach, max_line_bytes=MAX_LINE_BYTES)
                    try:
                        await self.engine.run(self._start, container_id)
                    except SandboxError as err:
                        if _names_the_mount(err, listener):
                            raise _MountRefused(str(err)) from err
                        raise
                except BaseException:
                    getattr(attach, "close", lambda: None)()
                    raise
                if listener is not None:
                    channel = await upgrade(channel, listener, max_line_bytes=MAX_LINE_BYTES)
        except BaseException:
            listed = {"Id": container_id, "Labels": {L.CHANNEL_FOLDER: listener.folder if listener else ""}}
            await asyncio.shield(self.engine.run(self._remove_container, listed))
            raise
        finally:
            if listener is not None:
                listener.close()
        return container_id, channel

    def channel_problem(self, settings: ContainerSettings, *, live_restore: bool = False) -> str | None:
        """Why a shim started with ``settings`` would stay on attach, not the direct channel, or
        None (blocking: asks the engine once).

        Raises:
            DockerUnavailableError: no engine answers.
        """
        if not self.direct_channel:
            return "the direct channel is turned off (SOFTPROBE_GYM_CHANNEL=attach or direct_channel=False)"
        if self._engine_info is None:
            self._engine_info = self.engine.info()
        return direct_channel_problem(info=self._engine_info, settings=settings,
                                      engine_url=str(self.client.api.base_url), live_restore=live_restore)

    async def _channel_listener(self, spec: SandboxSpec) -> ChannelListener | None:
        """A listener for the shim's direct channel, or None where attach must carry it (or is
        asked for: ``direct_channel=False``)."""
        if not self.direct_channel:
            return None
        problem = await self.engine.run(self.channel_problem, spec.settings, live_restore=spec.live is not None)
        if problem is None:
            try:
                return ChannelListener()
            except OSError as err:
                problem = f"no socket for the direct channel: {err}"
        if problem not in self._told:
            self._told.add(problem)
            log.info("the shims of this provider stay on attach: %s", problem)
        return None

    def _image_info_for(self, image: str, user: str | None) -> _ImageInfo:
        try:
            attrs = self._inspect_image(image)
        except docker.errors.ImageNotFound:
            raise ImageNotFoundError(
                f"image {image!r} is not on this Docker engine. Build the project's images with "
                "`softprobe-gym images build` (add --offline without a registry), or pull it."
            ) from None
        key = f"{attrs['Id']}|{user}"
        if key not in self._image_info:
            config = attrs.get("Config") or {}
            wanted = user if user is not None else (config.get("User") or None)
            uid, gid, resolved = self._resolve_user(attrs["Id"], wanted)
            image_labels = config.get("Labels") or {}
            baked = image_labels.get(L.SHIM_SHA256) == SHIM_SHA256
            self._image_info[key] = _ImageInfo(attrs["Id"], resolved, uid, gid, baked, service_images(image_labels),
                                               image_labels.get(WORLD_PROXY_IMAGE) or attrs["Id"])
        return self._image_info[key]

    @control_plane
    def _inspect_image(self, image: str) -> dict[str, Any]:
        # types-docker leaves the low-level APIClient methods unannotated; the result is the
        # engine's JSON for the image.
        attrs: dict[str, Any] = self.client.api.inspect_image(image)  # type: ignore[no-untyped-call]
        return attrs

    def _resolve_user(self, image_id: str, user: str | None) -> tuple[int, int, str | None]:
        """Numeric ids for the user tools run as, looking names up in the image's /etc/passwd.

        With no user configured anywhere, an ``agent`` account in the image is used if present
        (our images have one); otherwise root.
        """
        name, _, group = (user or "").partition(":")
        if name.isdigit() and (not group or group.isdigit()):
            return int(name), int(group or name), user
        passwd = self._read_image_file(image_id, "/etc/passwd")
        accounts = {}
        for line in passwd.splitlines():
            fields = line.split(":")
            if len(fields) >= 4 and fields[2].isdigit() and fields[3].isdigit():
                accounts[fields[0]] = (int(fields[2]), int(fields[3]))
        if not name:
            if "agent" in accounts:
                return (*accounts["agent"], "agent")
            return 0, 0, None
        if name not in accounts:
            raise SandboxError(f"user {name!r} does not exist in image {image_id[:19]}")
        uid, gid = accounts[name]
        return uid, int(group) if group.isdigit() else gid, user

    def _read_image_file(self, image_id: str, path: str) -> str:
        container = self.client.api.create_container(
            image_id, command=["true"], labels={L.MANAGED: "true", L.OWNER: L.current_owner()}
        )
        try:
            stream, _ = self.client.api.get_archive(container["Id"], path)
            with tempfile.TemporaryFile() as buffer:
                for chunk in stream:
                    buffer.write(chunk)
                buffer.seek(0)
                with tarfile.open(fileobj=buffer) as archive:
                    member = archive.next()
                    extracted = archive.extractfile(member) if member else None
                    return extracted.read().decode("utf-8", "replace") if extracted else ""
        except docker.errors.NotFound:
            return ""
        finally:
            self.engine.remove_container(container["Id"])

    def _prepare_seed(self, seed_root: Path, info: _ImageInfo) -> tuple[bytes | None, bytes | None]:
        """The seed as (an archive to put before start, or one for the shim's seed op).

        One walk of the tree per reset; the archive is rebuilt only when the tree changed.
        """
        signature = _tree_signature(seed_root)
        if not signature:
            return None, None
        if sum(entry[2] for entry in signature) <= SEED_BY_SHIM_MAX:
            return None, self._shim_seed(seed_root, signature)
        key = ("put", seed_root, signature, info.uid, info.gid, info.shim_baked)
        extra = {} if info.shim_baked else {SHIM_PATH: _SHIM_SOURCE}
        return self._cached_archive(
            # Never root-owned: the shim gives the agent every non-root entry of the workspace.
            key, lambda: build_seed_archive(seed_root, uid=info.uid or NOBODY, gid=info.gid or NOBODY, extra=extra)
        ), None

    def _shim_seed(self, seed_root: Path, signature: tuple[Any, ...] | None = None) -> bytes | None:
        """The seed as a tar for the shim's seed op (names relative to the workspace), or None."""
        signature = _tree_signature(seed_root) if signature is None else signature
        if not signature:
            return None
        return self._cached_archive(
            ("shim", seed_root, signature),
            lambda: build_seed_archive(seed_root, uid=0, gid=0, workspace=False, prefix=""),
        )

    def _cached_archive(self, key: tuple[Any, ...], build: Callable[[], bytes]) -> bytes:
        # A few recent seeds (a suite's tasks have their own); seeds can be large.
        if key in self._seed_archives:
            self._seed_archives.move_to_end(key)
        else:
            self._seed_archives[key] = build()
            while len(self._seed_archives) > 8:
                self._seed_archives.popitem(last=False)
        return self._seed_archives[key]

    @control_plane
    def _create(self, spec: SandboxSpec, info: _ImageInfo, ids: EpisodeIds, world: WorldContainers | None,
                listener: ChannelListener | None) -> str:
        settings = spec.settings
        api = self.client.api
        kwargs = host_config_kwargs(settings)
        if listener is not None:
            kwargs["mounts"] = [listener.mount()]
        environment = dict(settings.environment)
        networking = None
        if world is not None:
            # Only the world's own network, under the name "agent"; no upstream DNS.
            kwargs.update(network_mode=world.network, dns=NO_UPSTREAM_DNS)
            # The stub types the argument as one EndpointConfig; the API takes {network: config}.
            networking = api.create_networking_config(
                {world.network: api.create_endpoint_config(aliases=["agent"])})  # type: ignore[arg-type]
            if spec.world.network.mode == "egress":
                environment.update(proxy_environment([s.name for s in spec.world.services]))
        host_config = api.create_host_config(**kwargs)
        response = api.create_container(
            info.image_id,
            # -I: no user site, no PYTHON* variables, no script folder on sys.path, so nothing
            # the agent plants is imported by the shim.
            entrypoint=["python3", "-I", "-u", SHIM_PATH, "--workspace", WORKSPACE,
                        "--digest", spec.digest_mode, *_shim_options(settings, ids)],
            command=[],
            # The shim runs as container-root with a handful of capabilities and drops them for
            # every tool (see _SHIM_CAPABILITIES).
            user="0",
            working_dir=WORKSPACE,
            # The shim, as PID 1, ignores SIGTERM, and nothing in an episode needs a graceful
            # stop: without this an engine that stops (or restarts) waits 10 s per container.
            stop_signal="SIGKILL",
            stdin_open=True,
            tty=False,
            environment=environment,
            # Always set: a checkpoint image carries its parent's label, which must not name the
            # parent's folder on a child (a sweep would remove it under the running parent).
            labels={**spec.labels, L.AGENT_UID: str(ids.agent_uid),
                    L.CHANNEL_FOLDER: listener.folder if listener is not None else ""},
            network_disabled=settings.network == "none" and world is None,
            host_config=host_config,
            networking_config=networking,
        )
        container_id: str = response["Id"]
        return container_id

    def _place_live(self, container_id: str, restore: LiveRestore) -> None:
        live.place(live.data_root(self.client.api), container_id, restore.name, restore.folder / "agent")

    @control_plane
    def _put_archive(self, container_id: str, archive: bytes) -> None:
        self.client.api.put_archive(container_id, "/", archive)

    @control_plane
    def _attach(self, container_id: str) -> Any:
        params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
        return self.client.api.attach_socket(container_id, params=params)

    @control_plane
    def _start(self, container_id: str) -> None:
        self.client.api.start(container_id)

    # -- seeds, commits, images ----------------------------------------------------------------

    async def seed_archive(self, sandbox: Sandbox, seed_root: Path) -> bytes | None:
        return await self.engine.run(self._shim_seed, seed_root)

    async def commit(self, sandbox: Sandbox, *, labels: dict[str, str], max_bytes: int | None = None) -> str:
        if not isinstance(sandbox, DockerSandbox):
            raise SandboxError(f"the docker provider cannot commit a {type(sandbox).__name__}")
        return await self.engine.run(sandbox.commit_image, labels, max_bytes, self.flatten_at_layers)

    def check_live_checkpoint(self, settings: ContainerSettings) -> None:
        """Refuse live checkpoints where they cannot work (runc, experimental mode off, Docker
        Desktop, a remote engine, a data root this process cannot write).

        Raises:
            LiveCheckpointUnavailableError: the message says what to change.
            DockerUnavailableError: no engine answers.
        """
        problem = live.remote_engine_problem(self.engine.docker_host)  # before asking an engine anything
        if problem is None:
            problem = live.live_checkpoint_problem(self.engine.info(), settings, self.engine.docker_host)
        if problem is not None:
            raise LiveCheckpointUnavailableError(f"this host declares live_checkpoint, but {problem}")

    async def live_checkpoint(
        self, sandbox: Sandbox, *, labels: dict[str, str], folder: Path, name: str, max_bytes: int | None = None
    ) -> tuple[str, LiveRestore]:
        if not isinstance(sandbox, DockerSandbox):
            raise SandboxError(f"the docker provider cannot checkpoint a {type(sandbox).__name__}")
        return await sandbox.live_checkpoint(labels, folder, name, max_bytes, self.flatten_at_layers)

    async def resolve_image(self, image: str) -> str | None:
        try:
            return str((await self.engine.run(self._inspect_image, image))["Id"])
        except ImageNotFoundError:
            return None

    async def save_image(self, image: str) -> bytes:
        def save() -> bytes:
            return b"".join(self.client.images.get(image).save(named=True))

        return await self.engine.run(save)

    async def load_image(self, archive: bytes) -> list[str]:
        loaded = await self.engine.run(self.client.images.load, archive)
        return [str(image.id) for image in loaded]

    # -- cleanup -------------------------------------------------------------------------------

    async def remove_labelled(self, labels: dict[str, str]) -> list[str]:
        listed = await self.engine.run(self._list_containers, labels)
        await asyncio.gather(*(self.engine.run(self._remove_container, c) for c in listed))
        ids = [c["Id"] for c in listed]
        # A world's network goes once its members have.
        for network in await self.engine.run(self.worlds.list_networks, labels):
            await self.engine.run(self.worlds.remove_network, network["Id"])
        return ids

    @control_plane
    def _list_containers(self, labels: dict[str, str]) -> list[dict[str, Any]]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        listed: list[dict[str, Any]] = self.client.api.containers(all=True, filters=filters)
        return listed

    def _remove_container(self, container: dict[str, Any]) -> None:
        """Remove a listed container, then its channel folder on this host (blocking; a folder
        whose container could not be removed stays: it is the container's mount source)."""
        self.engine.remove_container(container["Id"])
        remove_folder((container.get("Labels") or {}).get(L.CHANNEL_FOLDER))

    async def remove_image(self, image_id: str) -> bool:
        return await self.engine.run(self._remove_image, image_id)

    def _remove_image(self, image_id: str) -> bool:
        try:
            labels = (self._inspect_image(image_id).get("Config") or {}).get("Labels") or {}
        except docker.errors.ImageNotFound:
            return True
        if not self._remove_one_image(image_id):
            return False
        # A world checkpoint: its services' snapshots go with the agent's.
        self.worlds.remove_images(service_images(labels).values())
        return True

    def _remove_one_image(self, image_id: str) -> bool:
        try:
            # Not forced: a forced removal of an image with dependants only untags it.
            control_plane(self.client.api.remove_image)(image_id)
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError as err:
            if err.status_code == 409:  # a container or a child image still needs it
                return False
            raise
        return True

    async def sweep(
        self, *, everything: bool = False, dry_run: bool = False, episode: str | None = None
    ) -> SweepReport:
        return await self.engine.run(self._sweep, everything, dry_run, episode)

    def _sweep(self, everything: bool, dry_run: bool, episode: str | None = None) -> SweepReport:
        report = SweepReport()
        api = self.client.api
        only = [f"{L.EPISODE}={episode}"] if episode is not None else []
        containers = control_plane(api.containers)(all=True, filters={"label": [L.MANAGED, *only]})
        for container in containers:
            if self._doomed(container.get("Labels") or {}, everything, report):
                report.removed_containers.append(container["Id"])
                if not dry_run:
                    self._remove_container(container)
        images = control_plane(api.images)(filters={"label": [L.CHECKPOINT, *only]})
        doomed = [i for i in images if self._doomed(i.get("Labels") or {}, everything, report)]
        report.removed_images.extend(i["Id"] for i in doomed)
        if not dry_run:
            # Checkpoint chains: a parent image goes only after its children, so newest first,
            # and again while a pass makes progress.
            pending = sorted(doomed, key=lambda i: i.get("Created", 0), reverse=True)
            while pending:
                left = [i for i in pending if not self._remove_image(i["Id"])]
                if len(left) == len(pending):
                    break
                pending = left
            for image in pending:
                report.removed_images.remove(image["Id"])
        if not dry_run:  # the channel folders of hosts that died, their containers gone or not
            sweep_folders()
        # After the containers: a network goes only once nothing is attached to it.
        for network in self.worlds.list_networks({L.MANAGED: "true", **({L.EPISODE: episode} if episode else {})}):
            if self._doomed(network.get("Labels") or {}, everything, report):
                report.removed_networks.append(network["Id"])
                if not dry_run:
                    self.worlds.remove_network(network["Id"])
        return report

    @staticmethod
    def _doomed(labels: dict[str, str], everything: bool, report: SweepReport) -> bool:
        if everything:
            return True
        status = L.owner_status(labels.get(L.OWNER, ""))
        if status is L.OwnerStatus.ALIVE:
            report.kept_live_owner += 1
            return False
        if status is L.OwnerStatus.OTHER_HOST:
            report.kept_other_host += 1
            return False
        return True

    async def close(self) -> None:
        self.discard()

    def discard(self) -> None:
        """Release the thread pool and the engine connection now (what ``close`` does)."""
        self.engine.discard()


#: What the shim (container-root) keeps: become the agent or tool uid (SETUID/SETGID), kill every
#: process after a step (KILL), give checkpoint and seed files to the episode's uid (CHOWN, and
#: FOWNER to set again the setuid/setgid bits the kernel drops with the owner), read every workspace
#: file for the digest, mode 000 included (DAC_READ_SEARCH). Tools get none: they are exec'ed
#: under a non-zero uid with no_new_privs.
_SHIM_CAPABILITIES = ("CHOWN", "DAC_READ_SEARCH", "FOWNER", "KILL", "SETGID", "SETUID")


def _shim_options(settings: ContainerSettings, ids: EpisodeIds) -> list[str]:
    options = [
        "--quota-bytes", str(parse_size(settings.workspace_quota_bytes or 0)),
        "--quota-inodes", str(settings.workspace_quota_inodes or 0),
        "--max-list-entries", str(settings.max_list_entries),
        "--max-changed-paths", str(settings.max_changed_paths),
    ]
    if settings.user is None:
        # Only a uid of the episode's own: RLIMIT_NPROC counts every process of the uid, the
        # host's included when a user named in settings exists on the host too.
        options += ["--max-processes", str(settings.pids_limit)]
    if ids.agent_uid:
        options += ["--agent-uid", str(ids.agent_uid), "--agent-gid", str(ids.agent_gid),
                    "--tool-uid", str(ids.tool_uid), "--tool-gid", str(ids.tool_gid)]
    return options


def host_config_kwargs(settings: ContainerSettings) -> dict[str, Any]:
    memory = settings.memory
    kwargs: dict[str, Any] = {
        "network_mode": settings.network,
        # The shim itself is PID 1 (it reaps orphans): with Docker's init, a same-uid init process
        # would hold the protocol pipes where tool processes could reach them.
        "init": False,
        # Under gVisor the cgroup's pids limit counts the sandbox kernel's own threads (too low
        # a limit crashes the whole sandbox): there the shim's RLIMIT_NPROC on the episode's uid,
        # which gVisor enforces, is the process limit.
        "pids_limit": None if settings.runtime == "runsc" else settings.pids_limit,
        "mem_limit": memory,
        "memswap_limit": memory,  # equal to memory: no swap beyond the limit
        "nano_cpus": int(settings.cpus * 1e9),
        "ulimits": [
            Ulimit(name="nofile", soft=settings.nofile, hard=settings.nofile),
            Ulimit(name="core", soft=0, hard=0),
            Ulimit(name="fsize", soft=parse_size(settings.max_file_size), hard=parse_size(settings.max_file_size)),
        ],
        # The protocol runs over attach, which does not depend on logs; the shim's stderr is kept
        # by the host (a bounded tail). So container logs cannot grow at all.
        "log_config": {"type": "none", "config": {}},
        "security_opt": ["no-new-privileges:true"] if settings.no_new_privileges else [],
    }
    if settings.tmp_size is not None:
        # Bounded scratch space; tmpfs pages count against the container's memory limit.
        kwargs["tmpfs"] = {"/tmp": f"rw,nosuid,nodev,size={settings.tmp_size},mode=1777"}
    if settings.runtime is not None:
        kwargs["runtime"] = settings.runtime
    if settings.drop_capabilities:
        kwargs["cap_drop"] = ["ALL"]
        kwargs["cap_add"] = sorted(set(_SHIM_CAPABILITIES) | set(settings.cap_add))
    elif settings.cap_add:
        kwargs["cap_add"] = list(settings.cap_add)
    return kwargs


class _MountRefused(SandboxError):
    """The engine refused a container with the direct channel's socket mounted."""


def _names_the_mount(err: SandboxError, listener: ChannelListener | None) -> bool:
    """Whether the engine's refusal is about the channel's mount (its source or its target)."""
    return listener is not None and (listener.folder in str(err) or CONTAINER_SOCKET in str(err))


def _keep(ids: EpisodeIds) -> None:
    """A live restore's uids are its parent's: not this provider's to hand out again."""


def _tree_signature(root: Path) -> tuple[Any, ...]:
    """Cheap identity of a seed tree: (folder, name, size, mtime, mode) per entry, to know when to
    rebuild its archive (and, summed, how big it is)."""
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + dirnames):
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            entries.append((dirpath, name, st.st_size, st.st_mtime_ns, st.st_mode))
    return tuple(entries)


__all__ = ["DockerProvider"]
