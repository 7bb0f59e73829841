"""The unit tier: no Docker engine, no Node. Hosts here run on the local-process provider, so
the episode API, training and evals above the provider seam are tested in milliseconds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from softprobe.gym import HostEnvironment, create_host_environment
from softprobe.gym.providers.local import LocalProvider


@pytest.fixture
def local_provider(tmp_path: Path) -> LocalProvider:
    """A local-process provider with its own private root under the test's folder."""
    return LocalProvider(root=tmp_path / "local-root")


@pytest.fixture
async def host(tmp_path: Path, seed_root: Path, local_provider: LocalProvider) -> AsyncIterator[HostEnvironment]:
    """A host on the local-process provider; after the test none of its sandboxes may remain."""
    env = create_host_environment(run_root=tmp_path / "run", seed_root=seed_root, provider=local_provider,
                                  tool_timeout_s=20)
    try:
        yield env
    finally:
        await env.close()
        left = list((local_provider.root / "sandboxes").glob("*"))
        assert not left, f"host left sandboxes behind: {left}"
