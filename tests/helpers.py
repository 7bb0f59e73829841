"""Small helpers shared by the tests."""

from __future__ import annotations

SUPPORT_DESK = "softprobe/support-desk:latest"
BASE = "softprobe/base:latest"


async def ready(host, episode_id: str = "ep-1") -> str:  # type: ignore[no-untyped-def]
    await host.create_episode(episode_id=episode_id)
    await host.reset(episode_id=episode_id)
    return episode_id


def tool(name: str, **args: object) -> dict[str, object]:
    return {"type": "tool", "name": name, "args": args}
