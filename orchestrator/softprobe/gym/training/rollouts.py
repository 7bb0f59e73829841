"""One rollout from a spec: the unit of work a batch hands to a host, local or on Ray.

:func:`run_rollout` takes any :class:`~softprobe.gym.episodes.protocol.Host`: on a local host it
runs a training session, finalizes and destroys the episode; on a ``DistributedHost`` it sends
the spec to the node it picks, which does the same there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from softprobe.gym.episodes.host import HostEnvironment
from softprobe.gym.episodes.protocol import Host
from softprobe.gym.errors import ConfigurationError, GymError
from softprobe.gym.training.session import RolloutResult, create_training_session


class RolloutSpec(BaseModel):
    """What one rollout runs.

    Attributes:
        episode_id: the episode it creates (and destroys afterwards).
        actions: a list of actions, or a policy ``policy(observation, last_step)``.
        reward_from: the training session's ``reward_from``, or None.
        max_steps: truncate after this many steps.
        seed_root: the episode's own seed folder on this machine (shipped as bytes to a Ray
            node), or None for the host's seed.
        tape_mode / tape: the episode's dependency tape (None: the host's); see
            :func:`~softprobe.gym.training.session.create_training_session`.
        record_processes / time_policy / random_seed: the episode's own (None: the host's);
            see the same function.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    episode_id: str
    actions: Any
    reward_from: Any = None
    max_steps: int | None = None
    seed_root: Path | None = None
    tape_mode: str | None = None
    tape: Path | None = None
    record_processes: bool | None = None
    time_policy: str | None = None
    random_seed: int | None = None


async def run_rollout(host: Host, spec: RolloutSpec) -> RolloutResult:
    """Run ``spec`` on ``host`` to the end; the episode is destroyed afterwards either way.

    Raises:
        GymError (and subclasses): the rollout failed; on Ray, ``NodeLostError`` or
            ``RolloutFailedError`` naming the node.
    """
    if isinstance(host, HostEnvironment):
        return await run_local_rollout(host, spec)
    run_rollouts = getattr(host, "run_rollouts", None)
    if run_rollouts is None:
        raise ConfigurationError(f"{type(host).__name__} can run no rollouts: it is neither local nor on Ray")
    (outcome,) = await run_rollouts([spec], concurrency=1)
    result: RolloutResult = outcome.unwrap()
    return result


async def run_local_rollout(host: HostEnvironment, spec: RolloutSpec) -> RolloutResult:
    """:func:`run_rollout` on a local host (also what a Ray node runs)."""
    session = create_training_session(
        host, episode_id=spec.episode_id, reward_from=spec.reward_from, max_steps=spec.max_steps,
        seed_root=spec.seed_root, tape_mode=spec.tape_mode, tape=spec.tape,
        record_processes=spec.record_processes, time_policy=spec.time_policy, random_seed=spec.random_seed,
    )
    try:
        async for _ in session.rollout(spec.actions):
            pass
        result = await session.finalize()
    except BaseException:
        try:  # the rollout's own error is the one to report
            await host.destroy(episode_id=spec.episode_id)
        except GymError:
            pass
        raise
    await host.destroy(episode_id=spec.episode_id)
    return result


def seed_files(folder: Path | None) -> dict[str, bytes] | None:
    """A seed folder as ``{relative path: bytes}``, to send to a machine that lacks it."""
    if folder is None:
        return None
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def write_seed_files(files: dict[str, bytes], folder: Path) -> Path:
    """Write ``seed_files`` output into ``folder`` (created, also when empty); return it."""
    for rel, data in files.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


__all__ = ["RolloutSpec", "run_local_rollout", "run_rollout", "seed_files", "write_seed_files"]
