"""Declared capabilities and the container settings of an episode (secure by default)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Capabilities(BaseModel):
    """What the host declares it can do. Declared up front, never inferred from the backend.

    The Docker backend's documented default declaration is
    ``environment_checkpoint=True, subject_state_import=False,
    deterministic_prefix_reexecution=True``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    environment_checkpoint: bool = True
    subject_state_import: bool = False
    deterministic_prefix_reexecution: bool = True


class ContainerSettings(BaseModel):
    """How each episode container is confined. Every default is the secure choice.

    Each field is a deliberate relaxation point; none is relaxed unless you set it.

    Attributes:
        network: Docker network mode. ``"none"`` (default) gives the container no network at all;
            ``"bridge"`` or a network name lets tools reach the network.
        memory: memory limit (bytes or a Docker size like ``"1g"``); swap is set equal, so the
            container cannot swap past it. An allocation beyond it is killed as out-of-memory.
        cpus: CPU quota in cores.
        pids_limit: most processes and threads at once; stops fork bombs.
        nofile: open-file limit (soft = hard).
        user: user to run the shim and tools as. ``None`` uses the image's ``USER`` (our images
            use ``agent``, uid 1000). Set ``"0"`` only if tools truly need root.
        drop_capabilities: drop every Linux capability (default). ``False`` keeps Docker's
            default set.
        cap_add: capabilities to add back after dropping all.
        no_new_privileges: forbid gaining privileges through setuid binaries (default).
        init: run an init process as PID 1 that reaps zombies (default).
        environment: variables set in the container, on top of the image's own. The host's
            environment is never passed in.
        extra_hosts / dns: left out on purpose; with ``network="none"`` they have no effect.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    network: str = "none"
    memory: int | str = "1g"
    cpus: float = Field(default=1.0, gt=0)
    pids_limit: int = Field(default=256, ge=16)
    nofile: int = Field(default=1024, ge=64)
    user: str | None = None
    drop_capabilities: bool = True
    cap_add: tuple[str, ...] = ()
    no_new_privileges: bool = True
    init: bool = True
    environment: dict[str, str] = Field(default_factory=dict)

    @field_validator("memory")
    @classmethod
    def _memory_is_positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 16 * 1024 * 1024:
            raise ValueError("memory must be at least 16 MiB")
        if isinstance(value, str) and not value.strip():
            raise ValueError("memory must be a size such as '1g'")
        return value
