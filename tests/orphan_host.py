"""A host process for test_gc: starts episodes and a checkpoint (and with --world, a world with a
service), says "ready", then waits to die."""

import asyncio
import sys

from softprobe.gym import create_host_environment


async def main(run_root: str, image: str, world: bool) -> None:
    host = create_host_environment(run_root=run_root, image=image)
    for i in range(3):
        await host.create_episode(episode_id=f"orphan-{i}")
        await host.reset(episode_id=f"orphan-{i}")
    await host.step(episode_id="orphan-0", action={"type": "tool", "name": "fs.write", "args": {"path": "a"}})
    await host.checkpoint(episode_id="orphan-0")
    if world:
        await leave_a_world(run_root, image)
    print("ready", flush=True)
    await asyncio.Event().wait()  # until SIGKILL


async def leave_a_world(run_root: str, image: str) -> None:
    """A world with a service: its network and sidecar are left behind too."""
    world = create_host_environment(run_root=run_root + "-world", image=image, services=[
        {"name": "idle", "image": image, "command": ["sleep", "600"]}])
    await world.create_episode(episode_id="orphan-world")
    await world.reset(episode_id="orphan-world")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], world="--world" in sys.argv[3:]))
