"""A warm pool: containers started ahead of time so that a reset only has to seed one.

One pool per host (its image and container settings). A taken container is used by exactly one
episode and removed with it; the pool refills in the background. Pool containers carry the
host's labels (and ``softprobe.gym.pool``), so ``close()``, the start-up sweep and
``softprobe-gym gc`` find them like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterator

from softprobe.gym.providers.base import Provider, SandboxSpec
from softprobe.gym.shim.runtime import Runtime

log = logging.getLogger("softprobe.gym.episodes.pool")


class WarmPool:
    """Keeps ``size`` started, unseeded sandboxes of ``spec`` ready."""

    def __init__(self, provider: Provider, spec: SandboxSpec, size: int) -> None:
        self._provider = provider
        self._spec = spec
        self.size = size
        self._ready: deque[Runtime] = deque()
        self._filling: set[asyncio.Task[None]] = set()
        self._removing: set[asyncio.Future[None]] = set()  # dead idle sandboxes being removed
        self._closed = False
        self._deferring = 0  # refill_after() blocks under way
        self.started = 0  # containers this pool has started (for tests and the bench)
        self.failures = 0

    @property
    def ready(self) -> int:
        return len(self._ready)

    def take(self) -> Runtime | None:
        """A ready sandbox, or None if none is ready (the caller starts one cold). Refills."""
        sandbox = None
        while self._ready:
            candidate = self._ready.popleft()
            if candidate.lost is None:
                sandbox = candidate
                break
            removal = asyncio.ensure_future(candidate.remove())  # died while idle
            self._removing.add(removal)
            removal.add_done_callback(self._removing.discard)
        self.refill()
        return sandbox

    def refill(self) -> None:
        """Start containers in the background until ``size`` are ready or starting (not within
        :meth:`refill_after`: then when it ends)."""
        while not self._closed and not self._deferring and len(self._ready) + len(self._filling) < self.size:
            task = asyncio.ensure_future(self._start_one())
            self._filling.add(task)
            task.add_done_callback(self._filling.discard)

    @contextlib.contextmanager
    def refill_after(self) -> Iterator[None]:
        """Within this, taken containers are replaced only when it ends: a group of episodes
        placed at once (``fork_many``) gets the pool's containers without new container starts
        competing with it for the CPU."""
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
            self.refill()

    async def wait_ready(self) -> None:
        """Wait until the pool is full (for warm-up before a benchmark or a batch)."""
        self.refill()
        while self._filling:
            await asyncio.gather(*list(self._filling), return_exceptions=True)

    async def _start_one(self) -> None:
        try:
            sandbox = await Runtime.start(self._provider, self._spec)
        except Exception as err:  # a failed refill must not break resets: they start cold
            self.failures += 1
            log.warning("warm pool could not start a container: %s", err)
            return
        self.started += 1
        if self._closed:
            await sandbox.remove()
        else:
            self._ready.append(sandbox)

    async def close(self) -> None:
        """Stop refilling and remove every ready container."""
        self._closed = True
        for task in list(self._filling):
            task.cancel()
        await asyncio.gather(*list(self._filling), return_exceptions=True)
        while self._ready:
            await self._ready.popleft().remove()
        await asyncio.gather(*list(self._removing), return_exceptions=True)
