"""The Docker provider of the sandbox interface.

Every blocking Docker call runs on a dedicated thread pool (never on the event loop), and every
control-plane call is retried on transient errors (see ``retry.py``). Tool calls go over the
container's attached stdin/stdout to the shim and are never retried.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import tarfile
import tempfile
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import docker
import docker.errors
import requests.exceptions
import urllib3.exceptions
from docker.types import Ulimit
from tenacity import retry, retry_if_exception, stop_after_delay, wait_random_exponential

from softprobe.gym import labels as L
from softprobe.gym.errors import (
    CheckpointTooLargeError,
    ConfigurationError,
    DockerUnavailableError,
    ImageNotFoundError,
    SandboxError,
    SandboxLostError,
    SandboxStartError,
)
from softprobe.gym.results import SkippedMember
from softprobe.gym.settings import ContainerSettings, parse_size
from softprobe.gym.providers.archive import build_seed_archive, safe_extract
from softprobe.gym.providers.docker.attach_channel import AttachChannel
from softprobe.gym.providers.base import Sandbox, SandboxBackend, SandboxSpec, SweepReport
from softprobe.gym.shim.protocol import CallResult, HelloResult
from softprobe.gym.providers.docker.uids import EpisodeIds, UidAllocator
from softprobe.gym.providers.docker.retry import control_plane, is_transient
from softprobe.gym.shim import SHIM_SHA256, shim_source
from softprobe.gym.shim.client import ShimClient

T = TypeVar("T")

SHIM_PATH = "/opt/softprobe/agent_shim.py"
WORKSPACE = "/workspace"
HELLO_TIMEOUT_S = 60.0
#: overlay2 refuses more than ~125 layers; a commit that would reach this many flattens instead.
FLATTEN_AT_LAYERS = 100
#: Seeds up to this size are sent through the shim; larger ones by archive before start.
SEED_BY_SHIM_MAX = 8 * 1024 * 1024
NOBODY = 65534
_SHIM_SOURCE = shim_source()



def connect_docker(docker_host: str | None = None, *, pool_size: int = 64) -> docker.DockerClient:
    """A Docker client for ``docker_host``, else ``DOCKER_HOST``, else the current Docker context
    (how Docker Desktop points the CLI at its socket), else the default socket.

    Connecting is retried briefly on transient errors (an engine restarting or a proxy in
    between); a unix socket that does not exist fails at once.

    Raises:
        DockerUnavailableError: nothing answers there.
    """
    base_url = docker_host or os.environ.get("DOCKER_HOST") or _context_host()
    where = base_url or "the default socket (/var/run/docker.sock)"
    socket_path = (base_url or "unix:///var/run/docker.sock").removeprefix("unix://")
    missing_socket = (base_url is None or base_url.startswith("unix://")) and not os.path.exists(socket_path)

    @retry(
        retry=retry_if_exception(lambda err: not missing_socket and isinstance(
            err, (docker.errors.DockerException, requests.exceptions.RequestException))),
        wait=wait_random_exponential(multiplier=0.1, max=1.0),
        stop=stop_after_delay(8),
        reraise=True,
    )
    def connect() -> docker.DockerClient:
        if base_url:
            client = docker.DockerClient(base_url=base_url, max_pool_size=pool_size, timeout=120)
        else:
            client = docker.from_env(max_pool_size=pool_size, timeout=120)
        client.ping()
        return client

    try:
        return connect()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as err:
        raise DockerUnavailableError(
            f"no Docker engine answers at {where}: {err}. Start Docker (Docker Desktop, or "
            "`dockerd`), or point DOCKER_HOST / `docker context use` at a running engine."
        ) from None


def _context_host() -> str | None:
    try:
        context = docker.ContextAPI.get_current_context()
    except Exception:  # a broken ~/.docker/config.json must not stop us from trying the default
        return None
    if context is None or context.name == "default":
        return None
    return context.Host or None


@dataclass(frozen=True)
class _ImageInfo:
    image_id: str
    user: str | None
    uid: int
    gid: int
    shim_baked: bool


class DockerBackend(SandboxBackend):
    """Runs each sandbox as a Docker container with the shim as its main process.

    Args:
        docker_host: engine address; default as in :func:`connect_docker`.
        max_workers: threads for blocking Docker calls (also the HTTP connection pool size), so
            that many episodes can start, copy and stop at once.
    """

    def __init__(
        self,
        *,
        docker_host: str | None = None,
        max_workers: int = 32,
        flatten_at_layers: int = FLATTEN_AT_LAYERS,
    ) -> None:
        self._docker_host = docker_host
        self.flatten_at_layers = flatten_at_layers
        self._max_workers = max_workers
        self._client: docker.DockerClient | None = None
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="softprobe-docker")
        self._image_info: dict[str, _ImageInfo] = {}
        self._uids = UidAllocator()
        self._seed_archives: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()

    # -- plumbing ------------------------------------------------------------------------------

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect_docker(self._docker_host, pool_size=self._max_workers * 2)
        return self._client

    async def _run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(func, *args, **kwargs))

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
        runtimes = sorted((control_plane(self.client.info)().get("Runtimes") or {}).keys())
        if settings.runtime not in runtimes:
            raise ConfigurationError(
                f"container runtime {settings.runtime!r} is not registered with this Docker engine "
                f"(it has: {', '.join(runtimes) or 'none'}). Register it in /etc/docker/daemon.json, "
                'e.g. {"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": '
                '["--network=none", "--overlay2=none"]}}} (Debian: apt-get install runsc), then '
                "restart dockerd; on Docker Desktop add the same under Settings > Docker Engine."
            )

    # -- start ---------------------------------------------------------------------------------

    async def start(self, spec: SandboxSpec) -> Sandbox:
        info = await self._run(self._image_info_for, spec.image, spec.settings.user)
        seed = spec.seed_root if spec.copy_seed else None
        # Small seeds travel through the shim after start (no extra Docker call); large ones,
        # and the shim itself for images that lack it, go in by one archive before start.
        archive, shim_seed = None, None
        if seed is not None:
            archive, shim_seed = await self._run(self._prepare_seed, seed, info)
        # A checkpoint image's shim file is never trusted: the library's own is put over it.
        if archive is None and (not info.shim_baked or not spec.copy_seed):
            archive = build_seed_archive(
                None, uid=info.uid, gid=info.gid, extra={SHIM_PATH: _SHIM_SOURCE}, workspace=spec.copy_seed
            )
        elif archive is not None and not spec.copy_seed:
            raise SandboxError("a checkpoint image is started without seed files")
        ids = self._uids.allocate(spec.settings, info)
        try:
            container_id = await self._run(self._create, spec, info, ids)
        except BaseException:
            self._uids.release(ids)
            raise
        client: ShimClient | None = None
        try:
            if archive is not None:
                await self._run(self._put_archive, container_id, archive)
            attach = await self._run(self._attach, container_id)
            try:
                channel = await AttachChannel.open(attach, max_line_bytes=256 * 1024 * 1024)
                await self._run(self._start, container_id)
                client = ShimClient(channel)
                hello = await client.hello(timeout_s=HELLO_TIMEOUT_S)
            except BaseException:
                getattr(attach, "close", lambda: None)()
                raise
            if hello.shim_sha256 != SHIM_SHA256:
                raise SandboxStartError(
                    f"the shim in a container of {spec.image!r} is not this library's (sha256 "
                    f"{hello.shim_sha256[:12] or 'unknown'}, expected {SHIM_SHA256[:12]}); rebuild the "
                    "image with `softprobe-gym images build`"
                )
            sandbox = DockerSandbox(self, container_id, info.image_id, client, hello, info.user, ids)
            if shim_seed is not None:
                await sandbox.seed_archive(shim_seed)
        except BaseException as err:
            # Nothing of a sandbox that did not start may stay: its connection, its container,
            # its uids.
            if client is not None:
                client.close()
            try:
                await asyncio.shield(self._run(self._remove, container_id))
            finally:
                self._uids.release(ids)
            if isinstance(err, SandboxLostError):
                raise SandboxStartError(
                    f"the shim in a container of {spec.image!r} did not start: {err}. The image needs "
                    "python3 (>= 3.8) on PATH and a /bin/sh."
                ) from None
            raise
        return sandbox

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
            baked = ((config.get("Labels") or {}).get(L.SHIM_SHA256)) == SHIM_SHA256
            self._image_info[key] = _ImageInfo(attrs["Id"], resolved, uid, gid, baked)
        return self._image_info[key]

    @control_plane
    def _inspect_image(self, image: str) -> dict[str, Any]:
        return self.client.api.inspect_image(image)

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
            self._remove(container["Id"])

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
    def _create(self, spec: SandboxSpec, info: _ImageInfo, ids: EpisodeIds) -> str:
        settings = spec.settings
        api = self.client.api
        host_config = api.create_host_config(**_host_config_kwargs(settings))
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
            stdin_open=True,
            tty=False,
            environment=dict(settings.environment),
            labels={**spec.labels, L.AGENT_UID: str(ids.agent_uid)},
            network_disabled=settings.network == "none",
            host_config=host_config,
        )
        return response["Id"]

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

    @control_plane
    def _container_state(self, container_id: str) -> dict[str, Any]:
        return dict(self.client.api.inspect_container(container_id).get("State") or {})

    def _remove(self, container_id: str) -> None:
        try:
            self._remove_with_retry(container_id)
        except docker.errors.NotFound:
            pass

    @control_plane
    def _remove_with_retry(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.APIError as err:
            # "removal already in progress" means someone else is finishing the job.
            if err.status_code == 409 and "already in progress" in str(err.explanation):
                return
            raise

    # -- cleanup -------------------------------------------------------------------------------

    async def remove_labelled(self, labels: dict[str, str]) -> list[str]:
        ids = await self._run(self._list_containers, labels)
        await asyncio.gather(*(self._run(self._remove, cid) for cid in ids))
        return ids

    @control_plane
    def _list_containers(self, labels: dict[str, str]) -> list[str]:
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
        return [c["Id"] for c in self.client.api.containers(all=True, filters=filters)]

    async def remove_image(self, image_id: str) -> bool:
        return await self._run(self._remove_image, image_id)

    def _remove_image(self, image_id: str) -> bool:
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

    async def sweep(self, *, everything: bool = False, dry_run: bool = False) -> SweepReport:
        return await self._run(self._sweep, everything, dry_run)

    def _sweep(self, everything: bool, dry_run: bool) -> SweepReport:
        report = SweepReport()
        api = self.client.api
        containers = control_plane(api.containers)(all=True, filters={"label": L.MANAGED})
        for container in containers:
            if self._doomed(container.get("Labels") or {}, everything, report):
                report.removed_containers.append(container["Id"])
                if not dry_run:
                    self._remove(container["Id"])
        images = control_plane(api.images)(filters={"label": L.CHECKPOINT})
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
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()
            self._client = None


#: What the shim (container-root) keeps: become the agent or tool uid (SETUID/SETGID), kill every
#: process after a step (KILL), give checkpoint and seed files to the episode's uid (CHOWN, and
#: FOWNER to clear a setuid bit the kernel will not carry to a new owner), read every workspace
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


def _host_config_kwargs(settings: ContainerSettings) -> dict[str, Any]:
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


def _config_changes(config: dict[str, Any], labels: dict[str, str], user: str | None) -> list[str]:
    """Dockerfile instructions that give an imported image the configuration of ``config``."""

    def quote(value: str) -> str:
        return json.dumps(value).replace("$", "\\$")

    changes = []
    for entry in config.get("Env") or []:
        key, _, value = entry.partition("=")
        changes.append(f"ENV {key}={quote(value)}")
    if config.get("WorkingDir"):
        changes.append(f"WORKDIR {config['WorkingDir']}")
    if user or config.get("User"):
        changes.append(f"USER {user or config['User']}")
    if config.get("Cmd"):
        changes.append(f"CMD {json.dumps(config['Cmd'])}")
    merged = dict(config.get("Labels") or {}, **labels)
    changes.extend(f"LABEL {quote(key)}={quote(value)}" for key, value in merged.items())
    return changes


def _last_json_line(response: Any) -> dict[str, Any]:
    text = response if isinstance(response, str) else bytes(response).decode("utf-8", "replace")
    lines = [line for line in text.strip().splitlines() if line.strip()]
    try:
        return dict(json.loads(lines[-1])) if lines else {}
    except ValueError:
        return {"status": text[-300:]}


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


class DockerSandbox(Sandbox):
    """A running episode container and the shim client talking to it."""

    def __init__(
        self,
        backend: DockerBackend,
        container_id: str,
        image_id: str,
        client: ShimClient,
        hello: HelloResult,
        user: str | None,
        ids: EpisodeIds,
    ) -> None:
        self._backend = backend
        self.ids = ids
        self.sandbox_id = container_id
        self.image_id = image_id
        self.hello = hello
        self._user = user
        self._shim = client
        self._removed = False

    @property
    def lost(self) -> str | None:
        return "the container was removed" if self._removed else self._shim.lost

    async def call_tool(
        self, *, tool: str, args: dict[str, Any], timeout_s: float, output_cap: int
    ) -> CallResult:
        try:
            return await self._shim.call_tool(
                tool=tool, args=args, timeout_s=timeout_s, output_cap=output_cap
            )
        except SandboxLostError as err:
            raise SandboxLostError(await self._why_lost(str(err))) from None

    async def _why_lost(self, reason: str) -> str:
        """``reason``, plus what the engine knows: a container the kernel OOM-killed as a whole
        (under gVisor a memory bomb takes the whole sandbox, not one process)."""
        try:
            state = await self._backend._run(self._backend._container_state, self.sandbox_id)
        except Exception:  # the container may be gone already; the original reason stands
            return reason
        if state.get("OOMKilled"):
            return (f"{reason}; the container ran out of memory and was killed as a whole (raise "
                    "container memory, or expect this for memory bombs under gVisor)")
        return reason

    async def seed(self, seed_root: Path | None) -> HelloResult:
        if seed_root is None:
            return self.hello
        archive = await self._backend._run(self._backend._shim_seed, seed_root)
        return self.hello if archive is None else await self.seed_archive(archive)

    async def seed_archive(self, archive: bytes) -> HelloResult:
        """Have the shim extract ``archive`` (names relative to the workspace)."""
        self.hello = await self._shim.seed(archive)
        return self.hello

    async def rescan(self) -> str:
        return (await self._shim.rescan()).workspace_digest

    async def exists(self, path: str) -> bool:
        return await self._shim.exists(path)

    async def read_text(self, path: str, *, max_bytes: int = 1 << 20) -> str:
        return await self._shim.read_text(path, max_bytes=max_bytes)

    async def copy_out(
        self, path: str, destination: Path, *, byte_budget: int | None = None
    ) -> list[SkippedMember]:
        return await self._backend._run(self._copy_out, path, destination, byte_budget)

    def _copy_out(self, path: str, destination: Path, byte_budget: int | None) -> list[SkippedMember]:
        api = self._backend.client.api
        try:
            stream, _ = control_plane(api.get_archive)(self.sandbox_id, path)
        except docker.errors.APIError as err:
            raise SandboxError(f"copying {path} out of the container failed: {err}") from None
        # Extracted as it arrives: never spooled, so the budget bounds what the host stores, and
        # a budget reached early stops the transfer (closing the stream drops the connection).
        try:
            return safe_extract(_ChunkReader(stream), destination, byte_budget=byte_budget)  # type: ignore[arg-type]
        except (tarfile.TarError, requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as err:
            raise SandboxError(f"copying {path} out of the container failed: {err}") from None
        finally:
            stream.close()

    async def commit(self, *, labels: dict[str, str], max_bytes: int | None = None) -> str:
        return await self._backend._run(self._commit, labels, max_bytes)

    def _commit(self, labels: dict[str, str], max_bytes: int | None = None) -> str:
        api = self._backend.client.api
        if max_bytes is not None:
            self._check_size(max_bytes)
        image = control_plane(api.inspect_image)(self.image_id)
        if len(image["RootFS"]["Layers"]) + 1 >= self._backend.flatten_at_layers:
            return self._flatten(image["Config"] or {}, labels)
        # No pause: commit only happens between steps, when no tool process is alive to write.
        response = control_plane(api.commit)(self.sandbox_id, conf={"Labels": labels}, pause=False)
        return str(response["Id"])

    def _check_size(self, max_bytes: int) -> None:
        """Refuse a commit whose layer would exceed ``max_bytes``. Docker's ``SizeRw`` is the
        apparent size of the container's changes: what ``docker commit`` copies into the layer."""
        api = self._backend.client.api
        listed = control_plane(api.containers)(all=True, filters={"id": self.sandbox_id}, size=True)
        size = int((listed[0].get("SizeRw") if listed else 0) or 0)
        if size > max_bytes:
            raise CheckpointTooLargeError(
                f"the container's filesystem changes are {size} bytes, over the checkpoint budget "
                f"of {max_bytes} bytes (checkpoint_budget_bytes); nothing was committed. Delete "
                "large files first (sparse files count at their full length), or raise the budget.",
                size_bytes=size,
                budget_bytes=max_bytes,
            )

    def _flatten(self, config: dict[str, Any], labels: dict[str, str]) -> str:
        """Snapshot as a one-layer image: export the container's filesystem, import it with the
        image's configuration. Slower than a commit, so only used when a commit chain gets deep."""
        api = self._backend.client.api
        changes = _config_changes(config, labels, self._user)
        exported = api.export(self.sandbox_id)
        response = api.import_image_from_stream(exported, changes=changes)
        status = _last_json_line(response)
        image_id = status.get("status", "")
        if not image_id.startswith("sha256:"):
            raise SandboxError(f"flattening the checkpoint failed: {status}")
        return image_id

    async def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        self._shim.close()
        try:
            await asyncio.shield(self._backend._run(self._backend._remove, self.sandbox_id))
        finally:
            self._backend._uids.release(self.ids)


__all__ = ["DockerBackend", "DockerSandbox", "connect_docker", "is_transient"]
