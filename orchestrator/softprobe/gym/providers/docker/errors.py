"""The one place where the Docker SDK's errors become the library's typed errors.

Everything the provider asks of the engine runs through :meth:`DockerEngine.run`, which hands
any SDK or transport error that escapes to :func:`translate`. Callers above the provider see
only :class:`~softprobe.gym.errors.SandboxError` and its subclasses.
"""

from __future__ import annotations

import docker.errors
import requests.exceptions

from softprobe.gym.errors import DockerUnavailableError, ImageNotFoundError, SandboxError

#: The SDK and transport errors :func:`translate` knows.
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException)


def translate(err: BaseException, doing: str) -> SandboxError:
    """The typed error for an engine error raised while ``doing`` (e.g. ``"create_container"``)."""
    if isinstance(err, docker.errors.ImageNotFound):
        return ImageNotFoundError(
            f"{doing}: an image is not on this Docker engine ({_explanation(err)}). Build the project's "
            "images with `softprobe-gym images build` (add --offline without a registry), or pull it."
        )
    if isinstance(err, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return DockerUnavailableError(
            f"{doing}: the Docker engine stopped answering ({err}). Check that Docker is running; "
            "episodes started before are lost if the engine restarted."
        )
    if isinstance(err, docker.errors.APIError):
        return SandboxError(f"{doing}: the Docker engine refused ({err.status_code}: {_explanation(err)})")
    return SandboxError(f"{doing}: {type(err).__name__}: {err}")


def _explanation(err: docker.errors.APIError) -> str:
    text = err.explanation if err.explanation else str(err)
    return str(text)[:500]


__all__ = ["ENGINE_ERRORS", "translate"]
