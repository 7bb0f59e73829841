"""A bundle as a host's configuration: what ``create_host_environment(bundle=...)`` uses."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from softprobe.gym.bundles.bundle import Bundle
from softprobe.gym.bundles.digest import ResolvedBundle, resolve_bundle
from softprobe.gym.bundles.loading import load_bundle
from softprobe.gym.providers.base import Provider

#: The :class:`~softprobe.gym.episodes.config.HostConfig` fields a bundle sets; passing the
#: ``create_host_environment`` keyword of one of them too is a conflict (``world`` is set by the
#: ``tools``, ``tool_files``, ``services`` and ``network`` keywords).
BUNDLE_OPTIONS = ("image", "seed_root", "world", "capabilities", "container", "max_steps", "tool_timeout_s",
                  "max_tool_timeout_s", "bundle_digest", "bundle_tape")


def resolve_now(bundle: str | Path | Bundle | ResolvedBundle, *, provider: Provider | None,
                docker_host: str | None = None) -> ResolvedBundle:
    """Load (a path) and resolve ``bundle`` against ``provider`` (default: a Docker provider of
    its own for ``docker_host``, closed after), from synchronous code, even with an event loop
    running in this thread; then save it in the bundle store (idempotent), so
    ``softprobe-gym bundle inspect DIGEST`` finds every digest a run records.

    Raises:
        BundleError: the bundle is invalid, an image it names is missing, or the store cannot
            be written.
        DockerUnavailableError: no engine answers (default provider only).
    """
    from softprobe.gym.bundles.store import save

    if isinstance(bundle, ResolvedBundle):
        save(bundle)
        return bundle
    loaded = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)

    async def resolve() -> ResolvedBundle:
        if provider is not None:
            return await resolve_bundle(loaded, provider)
        from softprobe.gym.providers.docker.provider import DockerProvider

        own = DockerProvider(docker_host=docker_host, max_workers=2)
        try:
            return await resolve_bundle(loaded, own)
        finally:
            await own.close()

    # A loop of its own in a thread of its own: the caller may be inside a running loop
    # (``async with create_host_environment(bundle=...)``), where asyncio.run is refused.
    outcome: list[ResolvedBundle] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(asyncio.run(resolve()))
        except BaseException as err:  # re-raised in the caller's thread
            failure.append(err)

    worker = threading.Thread(target=run, name="softprobe-bundle-resolve")
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    save(outcome[0])
    return outcome[0]


def host_options(bundle: str | Path | Bundle | ResolvedBundle, *, provider: Provider | None,
                 docker_host: str | None = None) -> dict[str, Any]:
    """The :class:`~softprobe.gym.episodes.config.HostConfig` fields a bundle sets (see
    :data:`BUNDLE_OPTIONS`), images pinned by id, with its digest.

    Raises:
        BundleError: see :func:`resolve_now`.
    """
    return resolve_now(bundle, provider=provider, docker_host=docker_host).host_options()


__all__ = ["BUNDLE_OPTIONS", "host_options", "resolve_now"]
