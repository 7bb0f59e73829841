"""The provider seam: where sandboxes run, and the handle to one that runs.

A :class:`Provider` knows *where*: it starts a sandbox from an image and a seed, commits and
removes images, and sweeps what dead owners left. A :class:`Sandbox` is one running sandbox: a
line channel to the shim inside it, plus copying files out and removing it. Nothing here knows
the shim's protocol; :class:`~softprobe.gym.runtime.Runtime` speaks it over any provider's
channel, so the host never depends on where its episodes run.

Providers: ``docker/`` (containers on a Docker engine; the only package that imports ``docker``)
and ``local/`` (the shim as a subprocess in a private folder: for development and tests, not for
untrusted agents).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from softprobe.gym.errors import CapabilityError, ConfigurationError, LiveCheckpointUnavailableError
from softprobe.gym.results import SkippedMember
from softprobe.gym.settings import ContainerSettings
from softprobe.gym.shim.client import LineChannel
from softprobe.gym.worlds import EgressReport, World

#: Where the workspace is, as the agent and the host's records name it.
WORKSPACE = "/workspace"


class LiveRestore(BaseModel):
    """Where a live checkpoint's process images are, for a sandbox restored from one.

    Attributes:
        folder: ``agent/`` (the episode container's checkpoint files) and ``services/<name>/``.
        name: the checkpoint's name.
        agent_ids: the uids and gids the checkpointed shim runs tools as (agent uid, agent gid,
            tool uid, tool gid): a restored shim keeps its parent's, in memory.
        services: the world's services whose processes were checkpointed.
    """

    model_config = ConfigDict(frozen=True)

    folder: Path
    name: str
    agent_ids: tuple[int, int, int, int]
    services: tuple[str, ...] = ()


class SandboxSpec(BaseModel):
    """Everything needed to start one episode's sandbox."""

    model_config = ConfigDict(frozen=True)

    image: str
    settings: ContainerSettings
    labels: dict[str, str]
    seed_root: Path | None = None
    copy_seed: bool = True  # False: the image already holds the workspace (a checkpoint)
    digest_mode: str = "inotify"  # how the shim tracks workspace changes: "inotify" or "scan"
    world: World = World()  # added tools, services and network policy around the agent's sandbox
    live: LiveRestore | None = None  # restore processes and memory from a live checkpoint (image: its commit)


#: The most paths :meth:`Sandbox.changed_outside_workspace` lists for a checkpoint to measure.
MAX_CHANGED_OUTSIDE = 50000


class Sandbox(ABC):
    """One running sandbox whose main process is the shim.

    Attributes:
        sandbox_id: the provider's id for it (a container id for Docker).
        image_id: the id of the image it was started from.
        channel: the line channel to the shim, open from start until :meth:`remove`.
        pending_seed: seed files (a tar, names relative to the workspace) the shim must extract
            before the first step, or None. A provider may send small seeds this way rather than
            copying them in before start; :class:`~softprobe.gym.runtime.Runtime` does it.
    """

    sandbox_id: str
    image_id: str
    channel: LineChannel
    pending_seed: bytes | None = None

    @abstractmethod
    async def copy_out(
        self, path: str, destination: Path, *, byte_budget: int | None = None
    ) -> list[SkippedMember]:
        """Copy ``path`` (a folder in the sandbox) to ``destination/<basename>`` on the host.

        Nothing is written, and no link made, that leads outside ``destination/<basename>``.
        Permission bits are kept (setuid, setgid and sticky dropped); sparse files stay sparse.
        What is not recreated is returned as skipped members, as readable text: links leading
        out, special files (FIFOs, devices), names that are not UTF-8 or too long for the host,
        and, once ``byte_budget`` bytes of file data would be exceeded, the rest of the copy.

        Raises:
            UnsafeArchiveError: a member's name would land outside ``destination``.
            SandboxError: the copy failed.
        """

    async def why_lost(self, reason: str, *, stream_ended: bool = False) -> str:
        """``reason`` (the channel broke), plus whatever the provider knows about why.
        ``stream_ended``: the shim's output ended (it exited or its sandbox died), rather than
        the shim not answering in time."""
        return reason

    async def changed_outside_workspace(self) -> list[str] | None:
        """The absolute paths a commit of the sandbox carries that it changed or added outside
        the workspace and the sandbox's mounts (its tmpfs), at most
        :data:`MAX_CHANGED_OUTSIDE` + 1; None where a commit carries the workspace only (the
        default)."""
        return None

    async def egress_report(self) -> EgressReport | None:
        """Under network mode ``egress``: what the world's proxy allowed and refused so far;
        None for any other world."""
        return None

    async def configure_http_tape(self, control: bytes) -> bool:
        """Hand the world's egress proxy its HTTP tape control (softprobe.gym.tapes.http);
        False when the sandbox has no such proxy (the default: only Docker worlds under network
        mode ``egress`` have one)."""
        return False

    async def http_journal(self, since: int) -> bytes | None:
        """The egress proxy's HTTP tape journal from byte ``since`` on (b"": nothing new), or
        None when the sandbox has no such proxy (the default)."""
        return None

    @abstractmethod
    async def remove(self) -> None:
        """Stop the sandbox and delete it. Idempotent; never raises for one already gone."""


class SweepReport(BaseModel):
    """What a sweep removed, and what it left because its owner may still be alive."""

    removed_containers: list[str] = []
    removed_images: list[str] = []
    removed_networks: list[str] = []
    kept_live_owner: int = 0
    kept_other_host: int = 0


class Provider(ABC):
    """Starts sandboxes and cleans up after them.

    Every sandbox and image a provider makes carries the labels it is given plus the owner
    (this process), so :meth:`sweep` removes exactly what dead owners left.

    Attributes:
        name: the provider's registered name (``"docker"``, ``"local"``).
        supports_commit: whether :meth:`commit` works (the ``environment_checkpoint``
            capability needs it).
    """

    name: str = "provider"
    supports_commit: bool = False

    def check_settings(self, settings: ContainerSettings) -> None:  # noqa: B027 - optional hook, no-op default
        """Raise ConfigurationError for settings this provider cannot honour (default: none)."""

    def check_world(self, world: World, settings: ContainerSettings) -> None:
        """Raise ConfigurationError for a world this provider cannot run.

        The default runs added tools only: no services, no network.
        """
        if world.services or world.network.mode != "none":
            raise ConfigurationError(
                f"the {self.name} provider runs no services and no network (network mode "
                f"{world.network.mode!r}, {len(world.services)} service(s)); use the Docker provider"
            )

    @abstractmethod
    async def start(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox from ``spec.image`` with the seed in its workspace and the shim as
        its main process; return it with the channel open (the handshake is the runtime's).

        Raises:
            ImageNotFoundError: the image does not exist where this provider runs.
            SandboxStartError / SandboxError: the sandbox could not be started (after retries).
        """

    @abstractmethod
    async def seed_archive(self, sandbox: Sandbox, seed_root: Path) -> bytes | None:
        """``seed_root`` as a tar the shim of ``sandbox`` extracts into its workspace (names
        relative to it), or None for an empty folder. Used on sandboxes started without seed
        files (the warm pool)."""

    async def commit(self, sandbox: Sandbox, *, labels: dict[str, str], max_bytes: int | None = None) -> str:
        """Snapshot the sandbox's filesystem as a new image carrying ``labels``; return its id.

        Only called between tool calls, when no process of a tool is running. Chains of commits
        (checkpoint, fork from it, checkpoint again...) never hit a storage limit on layers: a
        provider flattens the image before it would.

        Args:
            max_bytes: refuse when the sandbox's filesystem changes (apparent size, so a sparse
                file counts at its full length) exceed this; checked before anything is committed.

        Raises:
            CapabilityError: this provider cannot commit (see ``supports_commit``).
            CheckpointTooLargeError: the changes exceed ``max_bytes``; nothing was committed.
            SandboxError: the commit failed (after retries).
        """
        raise CapabilityError(f"the {self.name} provider cannot commit a sandbox (no checkpoints)")

    def check_live_checkpoint(self, settings: ContainerSettings) -> None:
        """Raise LiveCheckpointUnavailableError (saying what to change) when live checkpoints
        cannot work where this provider runs sandboxes of ``settings`` (default: never)."""
        raise LiveCheckpointUnavailableError(
            f"the {self.name} provider cannot take live checkpoints (processes and memory); use the Docker "
            "provider with gVisor (container={'runtime': 'runsc'}) on an engine with experimental mode on"
        )

    async def live_checkpoint(
        self, sandbox: Sandbox, *, labels: dict[str, str], folder: Path, name: str, max_bytes: int | None = None
    ) -> tuple[str, LiveRestore]:
        """Save the sandbox's processes and memory (and its world's services') into ``folder``
        with its filesystem committed as an image carrying ``labels``, at one instant; then
        restore the sandbox itself in place (``sandbox.channel`` is a new channel to the same
        shim, which goes on from where it was). Returns the image and what restores from it.

        Only called between tool calls. On failure nothing is kept: ``folder`` and any image
        made are removed, and the sandbox is restored as it was (SandboxLostError if it cannot).

        Raises:
            CapabilityError: this provider cannot (see :meth:`check_live_checkpoint`).
            CheckpointTooLargeError: as for :meth:`commit`.
            LiveCheckpointError: the runtime refused (the sandbox goes on as it was).
            SandboxLostError: the sandbox could not be brought back.
        """
        raise CapabilityError(f"the {self.name} provider cannot take live checkpoints")

    @abstractmethod
    async def remove_image(self, image_id: str) -> bool:
        """Delete an image this library created; True if it is gone (or was already).

        False when it is still needed (a sandbox runs from it, or an image is built on it):
        then nothing is removed and the caller may try again later.
        """

    @abstractmethod
    async def remove_labelled(self, labels: dict[str, str]) -> list[str]:
        """Remove every sandbox of this owner carrying all of ``labels``; return their ids."""

    @abstractmethod
    async def sweep(
        self, *, everything: bool = False, dry_run: bool = False, episode: str | None = None
    ) -> SweepReport:
        """Remove sandboxes and images left by owners that are gone (all of ours with
        ``everything``; only those of episode id ``episode`` when given). Never touches anything
        without our labels."""

    async def resolve_image(self, image: str) -> str | None:
        """The id of ``image`` where this provider runs, or None if it is not there."""
        return image

    async def save_image(self, image: str) -> bytes:
        """``image`` as an archive :meth:`load_image` of another provider of this kind accepts.

        Raises:
            CapabilityError: this provider cannot move images between machines.
        """
        raise CapabilityError(f"the {self.name} provider cannot save images")

    async def load_image(self, archive: bytes) -> list[str]:
        """Load images saved by :meth:`save_image`; return their ids.

        Raises:
            CapabilityError: this provider cannot move images between machines.
        """
        raise CapabilityError(f"the {self.name} provider cannot load images")

    @abstractmethod
    async def close(self) -> None:
        """Release the provider's own resources (connections, threads)."""

    def discard(self) -> None:  # noqa: B027 - optional hook, no-op default
        """Release the provider's resources without an event loop (a failed construction)."""


__all__ = ["MAX_CHANGED_OUTSIDE", "LiveRestore", "Provider", "Sandbox", "SandboxSpec", "SweepReport", "WORKSPACE"]
