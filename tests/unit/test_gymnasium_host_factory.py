"""The Gymnasium adapter on a host it is handed (here the local provider's; a Ray cluster's
DistributedHost.connect works the same way)."""

from __future__ import annotations

from pathlib import Path

from helpers import require_extra

from softprobe.gym import HostEnvironment, create_host_environment
from softprobe.gym.providers.local import LocalProvider

gymnasium_env = require_extra("softprobe.gym.training.gymnasium", "gymnasium")


def test_the_env_runs_on_the_host_its_factory_makes_and_closes_it(tmp_path: Path) -> None:
    made: list[HostEnvironment] = []

    async def factory() -> HostEnvironment:
        host = create_host_environment(run_root=tmp_path / "run", provider=LocalProvider(root=tmp_path / "root"))
        made.append(host)
        return host

    env = gymnasium_env.SoftprobeEnv(host_factory=factory, max_episode_steps=5)
    try:
        observation, _ = env.reset()
        assert '"shell.exec"' in observation
        text, reward, terminated, truncated, info = env.step('{"type":"tool","name":"fs.write","args":{"path":"a","content":"1"}}')
        assert info["changed_paths"] == ["a"] and not terminated and not truncated
    finally:
        env.close()
    assert len(made) == 1
    assert list((tmp_path / "root" / "sandboxes").glob("*")) == []  # closed with the env
