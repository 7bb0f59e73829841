"""The local-process provider: each sandbox a folder and a shim subprocess in local mode.

Layout under ``root`` (private to this user, mode 0700)::

    sandboxes/<id>/meta.json     labels and owner, for remove_labelled and sweep
    sandboxes/<id>/workspace/    the shim's workspace
    images/<id>/meta.json        a commit: its labels and owner
    images/<id>/workspace/       the committed workspace

The shim runs with ``--local``: it never signals, chmods or limits anything it did not start.
Image names other than this provider's commits mean "this machine as it is"; the container
settings' confinement (network, memory, capabilities, runtime) does not apply, and a runtime is
refused rather than ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
import tarfile
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from softprobe.gym import labels as L
from softprobe.gym.errors import CheckpointTooLargeError, ConfigurationError, ImageNotFoundError, SandboxError
from softprobe.gym.paths import remove_tree
from softprobe.gym.providers.archive import build_seed_archive, safe_extract
from softprobe.gym.providers.base import WORKSPACE, Provider, Sandbox, SandboxSpec, SweepReport
from softprobe.gym.providers.local.channel import PipeChannel
from softprobe.gym.providers.local.files import copy_tree, tar_tree
from softprobe.gym.providers.local.processes import kill_tree
from softprobe.gym.results import SkippedMember
from softprobe.gym.settings import ContainerSettings, parse_size
from softprobe.gym.shim import SHIM_PACKAGE
from softprobe.gym.shim.client import MAX_LINE_BYTES

#: Image ids this provider makes (and accepts for ``copy_seed=False`` starts).
IMAGE_PREFIX = "local-image:"
#: Runs the shim's package from the library's folder (argv[1] holds it), not as the zip
#: application a container runs: its compiled modules are then cached, where the zip application
#: compiles every module at each start (about 150 ms of CPU to 60 ms per start and hello). It
#: reports the sha256 of the artefact its files make, the one a container's shim reports.
_LAUNCH = "import sys; sys.path.insert(0, sys.argv[1]); from agent_shim.main import main; sys.exit(main(sys.argv[2:]))"
#: The folder that holds the shim's package.
_SHIM_FOLDER = str(SHIM_PACKAGE.parent)
#: How long a removed shim gets to exit on SIGTERM before SIGKILL.
STOP_GRACE_S = 5.0


def default_root() -> Path:
    """``$TMPDIR/softprobe-local-<uid>``: where sandboxes live unless a root is given."""
    return Path(tempfile.gettempdir()) / f"softprobe-local-{os.getuid()}"


class LocalSandbox(Sandbox):
    """A folder and the shim subprocess serving it."""

    def __init__(
        self,
        folder: Path,
        process: asyncio.subprocess.Process,
        image_id: str,
        pending_seed: bytes | None,
        release: Callable[[LocalSandbox], None],
    ) -> None:
        self.sandbox_id = folder.name
        self.image_id = image_id
        self.folder = folder
        self.workspace = folder / "workspace"
        self.process = process
        self.channel = PipeChannel(process, max_line_bytes=MAX_LINE_BYTES)
        self.pending_seed = pending_seed
        self._release = release
        self._removed = False

    async def copy_out(self, path: str, destination: Path, *, byte_budget: int | None = None) -> list[SkippedMember]:
        if path != WORKSPACE:
            raise SandboxError(f"the local provider copies out only {WORKSPACE}, not {path}")

        def copy() -> list[SkippedMember]:
            # Through a tar, so the same checks apply as to a container's archive.
            with tempfile.TemporaryFile() as spool:
                unreadable = tar_tree(self.workspace, spool)
                spool.seek(0)
                return unreadable + safe_extract(spool, destination, byte_budget=byte_budget)

        try:
            return await asyncio.to_thread(copy)
        except (OSError, tarfile.TarError) as err:
            raise SandboxError(f"copying {path} out of the local sandbox failed: {err}") from None

    async def why_lost(self, reason: str, *, stream_ended: bool = False) -> str:
        code = self.process.returncode
        return reason if code is None else f"{reason}; the shim exited with status {code}"

    async def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        self.channel.close()
        try:
            await _stop(self.process)
            await asyncio.to_thread(remove_tree, self.folder)
        finally:
            self._release(self)


class LocalProvider(Provider):
    """Runs each sandbox as a shim subprocess of this process (see the module docstring).

    Args:
        root: where sandboxes and commits live (default :func:`default_root`).
        manifest: a tools manifest (``tools.json``, as images carry at
            ``/etc/softprobe/tools.json``) declaring tools for every sandbox; none by default.
    """

    name = "local"
    supports_commit = True

    def __init__(self, *, root: Path | None = None, manifest: Path | None = None) -> None:
        # Not resolved: a symlink planted at the default root must be refused, not followed.
        self.root = Path(os.path.abspath(root or default_root()))
        self.manifest = manifest.resolve() if manifest is not None else None
        self._sandboxes: dict[str, LocalSandbox] = {}

    def _forget(self, sandbox: LocalSandbox) -> None:
        self._sandboxes.pop(sandbox.sandbox_id, None)

    def check_settings(self, settings: ContainerSettings) -> None:
        """Refuse a container runtime: there is no container to run it."""
        if settings.runtime is not None:
            raise ConfigurationError(
                f"the local provider runs no container, so runtime={settings.runtime!r} cannot apply; "
                "use the Docker provider for gVisor or other runtimes"
            )

    async def start(self, spec: SandboxSpec) -> Sandbox:
        folder = self._new_folder("sandboxes", spec.labels)
        workspace = folder / "workspace"
        try:
            image_id = await self.resolve_image(spec.image) or spec.image
            if not spec.copy_seed:
                source = self._image_folder(spec.image) / "workspace"
                if not source.is_dir():
                    raise ImageNotFoundError(f"image {spec.image!r} is not a commit of this local provider")
                await asyncio.to_thread(copy_tree, source, workspace)
            else:
                workspace.mkdir()
            seed = spec.seed_root if spec.copy_seed else None
            pending = build_seed_archive(seed, uid=0, gid=0, workspace=False, prefix="") if seed is not None else None
            process = await asyncio.create_subprocess_exec(
                *self._command(spec, workspace),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=str(workspace),
                env=_environment(spec.settings),
                start_new_session=True,  # its own session: our terminal's signals do not reach it
            )
        except BaseException:
            await asyncio.to_thread(remove_tree, folder)
            raise
        _write_meta(folder, spec.labels, pid=process.pid)
        sandbox = LocalSandbox(folder, process, image_id, pending, self._forget)
        self._sandboxes[sandbox.sandbox_id] = sandbox
        return sandbox

    def _command(self, spec: SandboxSpec, workspace: Path) -> list[str]:
        settings = spec.settings
        manifest = self.manifest or (workspace.parent / "no-tools.json")
        return [
            sys.executable, "-I", "-u", "-c", _LAUNCH, _SHIM_FOLDER, "--local",
            "--workspace", str(workspace), "--manifest", str(manifest), "--digest", spec.digest_mode,
            "--quota-bytes", str(parse_size(settings.workspace_quota_bytes or 0)),
            "--quota-inodes", str(settings.workspace_quota_inodes or 0),
            "--max-list-entries", str(settings.max_list_entries),
            "--max-changed-paths", str(settings.max_changed_paths),
        ]

    async def seed_archive(self, sandbox: Sandbox, seed_root: Path) -> bytes | None:
        return await asyncio.to_thread(build_seed_archive, seed_root, uid=0, gid=0, workspace=False, prefix="")

    async def commit(self, sandbox: Sandbox, *, labels: dict[str, str], max_bytes: int | None = None) -> str:
        if not isinstance(sandbox, LocalSandbox):
            raise SandboxError(f"the local provider cannot commit a {type(sandbox).__name__}")
        if max_bytes is not None:
            _check_size(sandbox.workspace, max_bytes)
        folder = self._new_folder("images", labels)
        try:
            await asyncio.to_thread(copy_tree, sandbox.workspace, folder / "workspace")
        except BaseException:
            await asyncio.to_thread(remove_tree, folder)
            raise
        _write_meta(folder, labels)
        return IMAGE_PREFIX + folder.name

    async def resolve_image(self, image: str) -> str | None:
        if image.startswith(IMAGE_PREFIX):
            return image if (self._image_folder(image) / "workspace").is_dir() else None
        return image  # any other name: this machine as it is

    async def remove_image(self, image_id: str) -> bool:
        if image_id.startswith(IMAGE_PREFIX):
            await asyncio.to_thread(remove_tree, self._image_folder(image_id))
        return True

    async def remove_labelled(self, labels: dict[str, str]) -> list[str]:
        owner = L.current_owner()
        removed = []
        for folder, meta in self._listed("sandboxes"):
            tags = meta.get("labels", {})
            if tags.get(L.OWNER) == owner and all(tags.get(k) == v for k, v in labels.items()):
                await self._remove_folder(folder, meta)
                removed.append(folder.name)
        return removed

    async def sweep(
        self, *, everything: bool = False, dry_run: bool = False, episode: str | None = None
    ) -> SweepReport:
        report = SweepReport()
        for kind, found in (("sandboxes", report.removed_containers), ("images", report.removed_images)):
            for folder, meta in self._listed(kind):
                if episode is not None and meta.get("labels", {}).get(L.EPISODE) != episode:
                    continue
                status = L.owner_status(meta.get("labels", {}).get(L.OWNER, ""))
                if not everything and status is L.OwnerStatus.ALIVE:
                    report.kept_live_owner += 1
                    continue
                if not everything and status is L.OwnerStatus.OTHER_HOST:
                    report.kept_other_host += 1
                    continue
                found.append(folder.name)
                if not dry_run:
                    await self._remove_folder(folder, meta)
        return report

    async def close(self) -> None:
        for sandbox in list(self._sandboxes.values()):
            await sandbox.remove()
        self._sandboxes.clear()

    def discard(self) -> None:
        for sandbox in self._sandboxes.values():
            with contextlib.suppress(ProcessLookupError):
                sandbox.process.kill()

    # -- folders -----------------------------------------------------------------------------------

    def _private_root(self) -> Path:
        """The root, made if missing; refused unless it is a real folder of this user that
        nobody else can enter (the default lives in the shared temp folder)."""
        with contextlib.suppress(FileExistsError):
            self.root.parent.mkdir(parents=True, exist_ok=True)
            self.root.mkdir(mode=0o700)
        st = os.lstat(self.root)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise ConfigurationError(
                f"the local provider's root {self.root} is not a private folder of this user (a folder "
                "owned by you with mode 0700, not a symlink); remove it or pass LocalProvider(root=...)"
            )
        return self.root

    def _new_folder(self, kind: str, labels: dict[str, str]) -> Path:
        parent = self._private_root() / kind
        parent.mkdir(exist_ok=True)
        folder = parent / uuid.uuid4().hex
        folder.mkdir(mode=0o700)
        _write_meta(folder, labels)
        return folder

    def _image_folder(self, image_id: str) -> Path:
        name = image_id.removeprefix(IMAGE_PREFIX)
        if not name.isalnum():
            raise ImageNotFoundError(f"{image_id!r} is not an image of the local provider")
        return self.root / "images" / name

    def _listed(self, kind: str) -> list[tuple[Path, dict[str, Any]]]:
        found = []
        for folder in sorted((self.root / kind).glob("*")) if (self.root / kind).is_dir() else []:
            try:
                meta = json.loads((folder / "meta.json").read_text())
            except (OSError, ValueError):
                continue  # being created, or not ours
            if meta.get("labels", {}).get(L.MANAGED) == "true":
                found.append((folder, meta))
        return found

    async def _remove_folder(self, folder: Path, meta: dict[str, Any]) -> None:
        sandbox = self._sandboxes.pop(folder.name, None)
        if sandbox is not None:
            await sandbox.remove()
            return
        pid = meta.get("pid")
        # A shim of a dead owner of this machine: only if that pid still runs our shim program.
        if isinstance(pid, int) and _runs_shim(pid, folder):
            await asyncio.to_thread(kill_tree, pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(remove_tree, folder)


def _write_meta(folder: Path, labels: dict[str, str], pid: int | None = None) -> None:
    meta: dict[str, Any] = {"labels": {L.MANAGED: "true", L.OWNER: L.current_owner(), **labels}}
    if pid is not None:
        meta["pid"] = pid
    tmp = folder / "meta.json.tmp"
    tmp.write_text(json.dumps(meta))
    os.replace(tmp, folder / "meta.json")


def _environment(settings: ContainerSettings) -> dict[str, str]:
    """A small environment: PATH, LANG and the settings' variables; nothing of this process's
    secrets (tokens in the environment) reaches the agent's commands."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    env.update(settings.environment)
    return env


def _check_size(workspace: Path, max_bytes: int) -> None:
    size = 0
    for dirpath, _, filenames in os.walk(workspace):
        for name in filenames:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(dirpath, name)).st_size
    if size > max_bytes:
        raise CheckpointTooLargeError(
            f"the workspace holds {size} bytes, over the checkpoint budget of {max_bytes} bytes "
            "(checkpoint_budget_bytes); nothing was committed",
            size_bytes=size,
            budget_bytes=max_bytes,
        )


def _runs_shim(pid: int, folder: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return _SHIM_FOLDER.encode() in cmdline and str(folder / "workspace").encode() in cmdline


async def _stop(process: asyncio.subprocess.Process) -> None:
    """End the shim and everything below it: the tree first (while the shim, a subreaper, still
    holds what its commands left), then the shim (SIGTERM, SIGKILL after a grace period)."""
    if process.returncode is None:
        await asyncio.to_thread(kill_tree, process.pid)
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


__all__ = ["IMAGE_PREFIX", "LocalProvider", "LocalSandbox", "default_root"]
