"""A destroy that lands while another call awaits keeps the episode destroyed (local provider)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers import tool

from softprobe.gym import EpisodeState, LifecycleError, create_host_environment
from softprobe.gym.providers.local import LocalProvider
from softprobe.gym.providers.local.provider import LocalSandbox


async def test_destroy_while_finalize_drops_a_dead_sandbox_stays_destroyed(
    tmp_path: Path, local_provider: LocalProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    real_remove = LocalSandbox.remove

    async def gated_remove(self: LocalSandbox) -> None:  # finalize is dropping the dead sandbox
        entered.set()
        await release.wait()
        await real_remove(self)

    async with create_host_environment(run_root=tmp_path / "run", provider=local_provider) as host:
        await host.create_episode(episode_id="e")
        await host.reset(episode_id="e")
        await host.step(episode_id="e", action=tool("fs.write", path="a", content="1"))
        runtime = host.runtime_of(episode_id="e")
        assert isinstance(runtime.sandbox, LocalSandbox)
        runtime.sandbox.process.kill()  # the sandbox dies between steps (OOM, engine restart...)
        await runtime.sandbox.process.wait()
        real_remove_labelled = local_provider.remove_labelled

        async def remove_labelled(labels: dict[str, str]) -> list[str]:  # destroy has marked it
            release.set()
            return await real_remove_labelled(labels)

        monkeypatch.setattr(LocalSandbox, "remove", gated_remove)
        monkeypatch.setattr(local_provider, "remove_labelled", remove_labelled)
        finalize = asyncio.ensure_future(host.finalize(episode_id="e"))
        await entered.wait()
        await host.destroy(episode_id="e")
        with pytest.raises(LifecycleError, match="destroyed"):
            await finalize
        assert host.state(episode_id="e") is EpisodeState.DESTROYED
        assert not (tmp_path / "run" / "episodes" / "e" / "result.json").exists()
