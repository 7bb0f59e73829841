"""Forks: the two legal paths, what each needs, and the checks made before any work is done.

- ``checkpoint_import`` (needs ``environment_checkpoint`` and ``subject_state_import``): the
  child starts from the checkpoint's image and the subject's state saved with it. Nothing re-runs.
- ``prefix_reexecution`` (needs ``deterministic_prefix_reexecution``): the child starts from the
  seed and re-executes the parent's first N actions, each checked against the parent's digest.

Anything else is refused with :class:`UnsupportedForkError`. A mid-episode world is never
restored and then replayed against with mutating actions.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel

from softprobe.gym.errors import ForkRequestError, UnsupportedForkError
from softprobe.gym.results import EpisodeState
from softprobe.gym.settings import Capabilities


class ForkPath(str, Enum):
    CHECKPOINT_IMPORT = "checkpoint_import"
    PREFIX_REEXECUTION = "prefix_reexecution"


REQUIRED_CAPABILITIES: dict[ForkPath, tuple[str, ...]] = {
    ForkPath.CHECKPOINT_IMPORT: ("environment_checkpoint", "subject_state_import"),
    ForkPath.PREFIX_REEXECUTION: ("deterministic_prefix_reexecution",),
}


class ForkLineage(BaseModel):
    """Where a forked episode came from. Written to the child's ``episode.json``."""

    parent_episode_id: str
    branch_step: int
    path: Literal["checkpoint_import", "prefix_reexecution"]
    checkpoint_id: str | None = None
    workspace_digest: str  # verified equal to the parent's at branch_step


class ForkResult(BaseModel):
    """What ``fork`` returns: the child's id and lineage."""

    episode_id: str
    state: EpisodeState
    lineage: ForkLineage
    duration_ms: float


def check_fork_path(path: object, capabilities: Capabilities) -> ForkPath:
    """The legal path named by ``path``, or UnsupportedForkError naming what is missing."""
    try:
        fork_path = ForkPath(path)
    except ValueError:
        legal = " and ".join(repr(p.value) for p in ForkPath)
        raise UnsupportedForkError(
            f"fork path {path!r} is not legal: only {legal} are. A mid-episode world is never "
            "restored and then replayed against."
        ) from None
    needed = REQUIRED_CAPABILITIES[fork_path]
    missing = [name for name in needed if not getattr(capabilities, name)]
    if missing:
        raise UnsupportedForkError(
            f"fork path {fork_path.value!r} needs the capabilities {' and '.join(needed)}; "
            f"this host does not declare {', '.join(missing)}. Declare them in "
            "create_host_environment(capabilities=...) if the environment really supports them."
        )
    return fork_path


def check_prefix_length(prefix_length: object, available: int) -> int:
    if isinstance(prefix_length, bool) or not isinstance(prefix_length, int):
        raise ForkRequestError(
            f"prefix_reexecution needs prefix_length=N (an int from 0 to {available}), "
            f"got {prefix_length!r}"
        )
    if not 0 <= prefix_length <= available:
        raise ForkRequestError(
            f"prefix_length={prefix_length} is out of range: the parent has taken {available} "
            f"steps since its last reset, so N must be between 0 and {available}"
        )
    return prefix_length
