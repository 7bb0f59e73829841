"""The labels on every container and image softprobe-gym creates, and who owns them.

An *owner* is one host process: ``<hostname>:<pid>:<start-ticks>``. The start time guards against
a recycled pid. ``softprobe-gym gc`` and each new host remove what belongs to owners that are gone.
"""

from __future__ import annotations

import os
import socket
from enum import Enum
from functools import lru_cache

MANAGED = "softprobe.gym.managed"
EPISODE = "softprobe.gym.episode"
OWNER = "softprobe.gym.owner"
HOST = "softprobe.gym.host"
CHECKPOINT = "softprobe.gym.checkpoint"
POOL = "softprobe.gym.pool"
AGENT_UID = "softprobe.gym.agent-uid"  # the kernel uid the episode's tools run as
SHIM_SHA256 = "softprobe.gym.shim-sha256"
BUILD_HASH = "softprobe.gym.build-hash"
IMAGE_NAME = "softprobe.gym.image"
#: The host folder of a container's direct-channel socket, removed with the container.
CHANNEL_FOLDER = "softprobe.gym.channel-folder"


class OwnerStatus(str, Enum):
    ALIVE = "alive"
    GONE = "gone"
    OTHER_HOST = "other-host"


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 on), or [] where /proc
    is missing. The command name (field 2) may contain spaces, so the split is after its ')'."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" where /proc is missing)."""
    fields = _stat_fields(pid)
    return fields[19] if len(fields) > 19 else ""


@lru_cache(maxsize=1)
def current_owner() -> str:
    """This process's owner id."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid)}"


def owner_status(owner: str) -> OwnerStatus:
    """Whether the process that owns a labelled resource still runs on this machine."""
    hostname, _, rest = owner.partition(":")
    pid_text, _, ticks = rest.partition(":")
    if hostname != socket.gethostname():
        return OwnerStatus.OTHER_HOST
    try:
        pid = int(pid_text)
        os.kill(pid, 0)
    except ProcessLookupError:
        return OwnerStatus.GONE
    except PermissionError:
        pass  # alive, just not ours to signal
    except ValueError:
        return OwnerStatus.GONE
    fields = _stat_fields(pid)
    if fields[:1] in (["Z"], ["X"]):
        # Killed (SIGKILL) but not yet reaped by its parent: signal 0 still reaches a zombie,
        # yet it will never remove what it made.
        return OwnerStatus.GONE
    if ticks and len(fields) > 19 and fields[19] != ticks:
        return OwnerStatus.GONE  # the pid was reused by another process
    return OwnerStatus.ALIVE
