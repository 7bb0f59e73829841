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


class OwnerStatus(str, Enum):
    ALIVE = "alive"
    GONE = "gone"
    OTHER_HOST = "other-host"


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" where /proc is missing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # Field 22; the command name (field 2) may contain spaces, so split after its ')'.
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


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
    if ticks and _start_ticks(pid) not in ("", ticks):
        return OwnerStatus.GONE  # the pid was reused by another process
    return OwnerStatus.ALIVE
