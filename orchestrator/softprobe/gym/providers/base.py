"""The one interface between the host and wherever episode containers run.

The host only ever talks to a :class:`SandboxBackend` (which starts sandboxes) and the
:class:`Sandbox` handles it returns (which run tools through the shim). Docker is the provider
in ``docker_backend.py``; nothing outside ``sandbox/`` imports ``docker``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from softprobe.gym.results import SkippedMember
from softprobe.gym.settings import ContainerSettings
from softprobe.gym.shim.protocol import CallResult, HelloResult


class SandboxSpec(BaseModel):
    """Everything needed to start one episode's sandbox."""

    model_config = ConfigDict(frozen=True)

    image: str
    settings: ContainerSettings
    labels: dict[str, str]
    seed_root: Path | None = None
    copy_seed: bool = True  # False: the image already holds the workspace (a checkpoint)
    digest_mode: str = "inotify"  # how the shim tracks workspace changes: "inotify" or "scan"


class Sandbox(ABC):
    """One running container with a live shim. Calls on one sandbox are served one at a time."""

    sandbox_id: str
    image_id: str
    hello: HelloResult

    @abstractmethod
    async def call_tool(
        self, *, tool: str, args: dict[str, Any], timeout_s: float, output_cap: int
    ) -> CallResult:
        """Run one tool and return its result. Never retried: a tool may have had effects.

        Args:
            tool: the tool name.
            args: its JSON arguments.
            timeout_s: the tool's processes are killed (whole process group) after this long;
                the result then carries a ``timeout`` error.
            output_cap: bytes of output kept; the rest is cut around a visible marker.

        Raises:
            SandboxLostError: the container or shim died, or no answer came within
                ``timeout_s`` plus a grace period. The sandbox is unusable afterwards.
        """

    @abstractmethod
    async def seed(self, seed_root: Path | None) -> HelloResult:
        """Copy ``seed_root`` into the workspace of this started sandbox; return the new hello.

        Used on containers started without seed files (the warm pool).
        """

    @abstractmethod
    async def rescan(self) -> str:
        """The workspace digest from a full walk, after killing every process but the shim.

        What ``finalize`` and ``checkpoint`` record: it trusts no incremental tracking.

        Raises:
            SandboxLostError: as for ``call_tool``.
        """

    @abstractmethod
    async def exists(self, path: str) -> bool:
        """Whether ``path`` (relative to the workspace) exists. Raises SandboxLostError."""

    @abstractmethod
    async def read_text(self, path: str, *, max_bytes: int = 1 << 20) -> str:
        """The first ``max_bytes`` of a workspace file as text (invalid UTF-8 replaced).

        Raises:
            SandboxError: the file does not exist or is outside the workspace.
            SandboxLostError: as for ``call_tool``.
        """

    @abstractmethod
    async def copy_out(
        self, path: str, destination: Path, *, byte_budget: int | None = None
    ) -> list[SkippedMember]:
        """Copy ``path`` (a directory in the container) to ``destination/<basename>`` on the host.

        Nothing is written, and no link made, that leads outside ``destination/<basename>``.
        Permission bits are kept (setuid, setgid and sticky dropped); sparse files stay sparse.
        What is not recreated is returned as skipped members, as readable text: links leading
        out, special files (FIFOs, devices), names that are not UTF-8 or too long for the host,
        and, once ``byte_budget`` bytes of file data would be exceeded, the rest of the copy.

        Raises:
            UnsafeArchiveError: a member's name would land outside ``destination``.
            SandboxError: the copy failed.
        """

    @abstractmethod
    async def commit(self, *, labels: dict[str, str], max_bytes: int | None = None) -> str:
        """Snapshot the container's filesystem as a new image carrying ``labels``; return its id.

        Only called between tool calls, when no process of a tool is running. Chains of commits
        (checkpoint, fork from it, checkpoint again...) never hit the storage driver's layer
        limit: a provider flattens the image before it would.

        Args:
            max_bytes: refuse when the container's filesystem changes (apparent size, so a
                sparse file counts at its full length, as an image layer would store it) exceed
                this; checked before anything is committed.

        Raises:
            CheckpointTooLargeError: the changes exceed ``max_bytes``; nothing was committed.
            SandboxError: the commit failed (after retries).
        """

    @abstractmethod
    async def remove(self) -> None:
        """Stop and delete the container. Idempotent; never raises for an already-gone one."""

    @property
    @abstractmethod
    def lost(self) -> str | None:
        """Why the sandbox stopped working, or None while it works."""


class SweepReport(BaseModel):
    """What a sweep removed, and what it left because its owner may still be alive."""

    removed_containers: list[str] = []
    removed_images: list[str] = []
    kept_live_owner: int = 0
    kept_other_host: int = 0


class SandboxBackend(ABC):
    """Starts sandboxes and cleans up after them."""

    def check_settings(self, settings: ContainerSettings) -> None:
        """Raise ConfigurationError for settings this provider cannot honour (default: none)."""

    @abstractmethod
    async def start(self, spec: SandboxSpec) -> Sandbox:
        """Start a container from ``spec.image``, copy ``spec.seed_root`` into ``/workspace``,
        start the shim and complete its handshake.

        Raises:
            ImageNotFoundError: the image does not exist on the engine.
            SandboxStartError: the container started but the shim did not come up.
            DockerUnavailableError / SandboxError: the engine failed (after retries).
        """

    @abstractmethod
    async def remove_labelled(self, labels: dict[str, str]) -> list[str]:
        """Remove every container carrying all of ``labels``; return their ids."""

    @abstractmethod
    async def remove_image(self, image_id: str) -> bool:
        """Delete an image this library created; True if it is gone (or was already).

        False when it is still needed (a container runs from it, or an image is built on it):
        then nothing is removed and the caller may try again later.
        """

    @abstractmethod
    async def sweep(self, *, everything: bool = False, dry_run: bool = False) -> SweepReport:
        """Remove containers and images left by owners that are gone (all of ours with
        ``everything``). Never touches anything without our labels."""

    @abstractmethod
    async def close(self) -> None:
        """Release the backend's own resources (connections, threads)."""
