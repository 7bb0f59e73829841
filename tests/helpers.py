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


# Lists "pid cmdline" for every process in the container from /proc (the images have no `ps`).
LIST_PROCESSES = "for d in /proc/[0-9]*; do printf '%s ' \"${d#/proc/}\"; tr '\\0' ' ' < \"$d/cmdline\" 2>/dev/null; echo; done"


async def processes(host, episode_id: str) -> str:  # type: ignore[no-untyped-def]
    """The container's process list; fails loudly if the listing itself did not work."""
    result = await host.step(episode_id=episode_id, action=tool("shell.exec", command=LIST_PROCESSES))
    listing = result.observation
    assert "agent_shim.py" in listing, f"the process listing did not work: {listing!r}"
    return listing


def host_containers(host) -> list:  # type: ignore[no-untyped-def]
    """Every container (running or not) carrying this host's label."""
    import docker

    from softprobe.gym import labels as L

    client = docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": f"{L.HOST}={host.host_id}"})
    finally:
        client.close()


def require_extra(module: str, extra: str):  # type: ignore[no-untyped-def]
    """Import an optional extra's module for a test module: skip (saying why) when it is missing,
    but fail under CI, which installs every extra."""
    import importlib
    import os

    import pytest

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{module} is an optional extra: pip install 'softprobe-gym[{extra}]'", allow_module_level=True)


def owned_by_process(pid: int) -> tuple[list[str], list[str]]:
    """Ids of the containers and images that the softprobe-gym process ``pid`` of this machine
    created (by owner label), so that leak checks ignore whatever other processes run on a
    shared engine. Lists without inspecting each object, so objects that others remove in the
    meantime cannot fail the check."""
    import os

    import docker

    from softprobe.gym import labels as L

    prefix = f"{os.uname().nodename}:{pid}:"
    client = docker.from_env()
    try:
        containers = client.api.containers(all=True, filters={"label": L.MANAGED})
        images = client.api.images(filters={"label": L.MANAGED})
    finally:
        client.close()
    mine = lambda objects: sorted(o["Id"] for o in objects if (o.get("Labels") or {}).get(L.OWNER, "").startswith(prefix))
    return mine(containers), mine(images)


def this_process(*labels: str) -> dict[str, list[str]]:
    """A Docker label filter for ``labels`` that also requires this test process as the owner."""
    from softprobe.gym import labels as L

    return {"label": [*labels, f"{L.OWNER}={L.current_owner()}"]}
