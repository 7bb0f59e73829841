"""Kernel uids for episodes: each episode's tools run under uids of their own.

Per-uid kernel limits (inotify instances and watches, processes, signals) are then per episode,
and never shared with the host's user or another episode. Without user namespaces a container
uid is the host's uid, so the range starts far above the uids that distributions hand out.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Protocol

#: Episode uids come in pairs (agent, tool) from [FIRST_UID, FIRST_UID + SPAN).
FIRST_UID = 1 << 20
SPAN = (1 << 30) - FIRST_UID


class _ResolvedUser(Protocol):
    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...


class _UserSetting(Protocol):
    user: str | None


@dataclass(frozen=True)
class EpisodeIds:
    """The uids of one episode. ``agent_uid == 0`` means tools run as root (``user="0"``)."""

    agent_uid: int
    agent_gid: int
    tool_uid: int
    tool_gid: int


class UidAllocator:
    """Hands out uid pairs no other live episode of this process has. Pairs are random within a
    span of about 10^9, so two processes sharing an engine collide with negligible probability."""

    def __init__(self) -> None:
        self._live: set[int] = set()

    def allocate(self, settings: _UserSetting, image_user: _ResolvedUser) -> EpisodeIds:
        """Ids for a new sandbox: fresh agent and tool uids, or, when ``settings.user`` names a
        user explicitly, that user's ids for the agent (root: tools run as root)."""
        base = self._fresh()
        if settings.user is None:
            return EpisodeIds(base, base, base + 1, base + 1)
        if image_user.uid == 0:
            self._live.discard(base)
            return EpisodeIds(0, 0, 0, 0)
        return EpisodeIds(image_user.uid, image_user.gid, base + 1, base + 1)

    def release(self, ids: EpisodeIds) -> None:
        self._live.discard(ids.tool_uid - 1)

    def _fresh(self) -> int:
        while True:
            base = FIRST_UID + 2 * secrets.randbelow(SPAN // 2)
            if base not in self._live:
                self._live.add(base)
                return base
