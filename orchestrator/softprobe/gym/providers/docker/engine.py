"""The connection to a Docker engine: one client factory and the thread pool Docker calls run on.

Every blocking Docker call runs on a dedicated thread pool (never on the event loop) through
:meth:`DockerEngine.run`; control-plane calls are retried on transient errors (``retry.py``).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions
from tenacity import retry, retry_if_exception, stop_after_delay, wait_random_exponential

from softprobe.gym.errors import DockerUnavailableError
from softprobe.gym.providers.docker.errors import ENGINE_ERRORS, translate
from softprobe.gym.providers.docker.retry import control_plane

T = TypeVar("T")


def connect_docker(docker_host: str | None = None, *, pool_size: int = 64) -> docker.DockerClient:
    """A Docker client for ``docker_host``, else ``DOCKER_HOST``, else the current Docker context
    (how Docker Desktop points the CLI at its socket), else the default socket.

    Connecting is retried briefly on transient errors (an engine restarting or a proxy in
    between); a unix socket that does not exist fails at once.

    Raises:
        DockerUnavailableError: nothing answers there.
    """
    base_url = docker_host or os.environ.get("DOCKER_HOST") or _context_host()
    where = base_url or "the default socket (/var/run/docker.sock)"
    socket_path = (base_url or "unix:///var/run/docker.sock").removeprefix("unix://")
    missing_socket = (base_url is None or base_url.startswith("unix://")) and not os.path.exists(socket_path)

    @retry(
        retry=retry_if_exception(lambda err: not missing_socket and isinstance(
            err, (docker.errors.DockerException, requests.exceptions.RequestException))),
        wait=wait_random_exponential(multiplier=0.1, max=1.0),
        stop=stop_after_delay(8),
        reraise=True,
    )
    def connect() -> docker.DockerClient:
        if base_url:
            client = docker.DockerClient(base_url=base_url, max_pool_size=pool_size, timeout=120)
        else:
            client = docker.from_env(max_pool_size=pool_size, timeout=120)
        client.ping()
        return client

    try:
        return connect()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as err:
        raise DockerUnavailableError(
            f"no Docker engine answers at {where}: {err}. Start Docker (Docker Desktop, or "
            "`dockerd`), or point DOCKER_HOST / `docker context use` at a running engine."
        ) from None


def _context_host() -> str | None:
    try:
        context = docker.ContextAPI.get_current_context()
    except Exception:  # a broken ~/.docker/config.json must not stop us from trying the default
        return None
    if context is None or context.name == "default":
        return None
    return context.Host or None



class DockerEngine:
    """One engine connection (made on first use) and the threads blocking calls run on.

    Args:
        docker_host: engine address; default as in :func:`connect_docker`.
        max_workers: threads for blocking Docker calls (also the HTTP connection pool size), so
            that many episodes can start, copy and stop at once.
    """

    def __init__(self, *, docker_host: str | None = None, max_workers: int = 32) -> None:
        self._docker_host = docker_host
        self._max_workers = max_workers
        self._client: docker.DockerClient | None = None
        self._executor = ThreadPoolExecutor(max_workers, thread_name_prefix="softprobe-docker")

    @property
    def docker_host(self) -> str | None:
        """The engine address this connects to (None: ``DOCKER_HOST`` or the default)."""
        return self._docker_host

    @property
    def client(self) -> docker.DockerClient:
        """The Docker client, connected on first use. Raises DockerUnavailableError."""
        if self._client is None:
            self._client = connect_docker(self._docker_host, pool_size=self._max_workers * 2)
        return self._client

    @property
    def api(self) -> Any:
        """The low-level API client (``docker.APIClient``)."""
        return self.client.api

    async def run(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``func(*args, **kwargs)`` on the engine's thread pool.

        Raises:
            SandboxError (or a subclass): an engine error escaped ``func``, translated by
                :func:`~softprobe.gym.providers.docker.errors.translate`.
        """
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, functools.partial(func, *args, **kwargs))
        except ENGINE_ERRORS as err:
            raise translate(err, getattr(func, "__name__", "a Docker call").lstrip("_")) from err

    def info(self) -> dict[str, Any]:
        """The engine's ``/info`` (blocking, retried like every control-plane call).

        Raises:
            DockerUnavailableError: no engine answers (or another SandboxError, translated).
        """
        try:
            return dict(control_plane(self.client.info)() or {})
        except ENGINE_ERRORS as err:
            raise translate(err, "info") from err

    def container_state(self, container_id: str, *, retry: bool = True, exit_wait_s: float = 0) -> dict[str, Any]:
        """The engine's ``State`` of a container (blocking); ``retry=False``: one try only.

        ``exit_wait_s``: a container still running is given that long to stop first. The engine
        records an exit (and an OOM kill) after the container's output has ended, so a state read
        the moment the stream ends may still say running.
        """
        inspect = control_plane(self.api.inspect_container) if retry else self.api.inspect_container
        state = dict(inspect(container_id).get("State") or {})
        if exit_wait_s > 0 and state.get("Running"):
            try:
                self.api.wait(container_id, timeout=exit_wait_s, condition="not-running")
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                return state  # still running: the shim closed its output but lives on
            state = dict(inspect(container_id).get("State") or {})
        return state

    def remove_container(self, container_id: str) -> None:
        """Force-remove a container and its anonymous volumes; one already gone is fine (blocking)."""
        try:
            self._remove_with_retry(container_id)
        except docker.errors.NotFound:
            pass

    @control_plane
    def _remove_with_retry(self, container_id: str) -> None:
        try:
            self.api.remove_container(container_id, force=True, v=True)
        except docker.errors.APIError as err:
            # "removal already in progress" means someone else is finishing the job.
            if err.status_code == 409 and "already in progress" in str(err.explanation):
                return
            raise

    def discard(self) -> None:
        """Release the thread pool and the connection now."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()
            self._client = None


__all__ = ["DockerEngine", "connect_docker"]
