"""Control-plane retries: transient Docker errors are retried, real answers are not."""

from __future__ import annotations

import docker.errors
import pytest
import requests

from softprobe.gym.providers.docker.retry import control_plane, is_transient


def api_error(status: int, explanation: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError("boom", response=response, explanation=explanation)


@pytest.mark.parametrize(
    "err, transient",
    [
        (requests.exceptions.ConnectionError("reset by peer"), True),
        (requests.exceptions.ReadTimeout("slow"), True),
        (api_error(500, "internal"), True),
        (api_error(503, "unavailable"), True),
        (api_error(409, "removal of container x is already in progress"), True),
        (api_error(409, "Conflict. The container name is already in use"), False),
        (api_error(400, "bad parameter"), False),
        (docker.errors.NotFound("gone"), False),
        (ValueError("not docker"), False),
    ],
)
def test_which_errors_are_transient(err, transient):
    assert is_transient(err) is transient


def test_a_flaky_call_is_retried_until_it_succeeds():
    calls = []

    @control_plane
    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise requests.exceptions.ConnectionError("engine restarting")
        return "ok"

    assert flaky() == "ok" and len(calls) == 3


def test_a_real_error_is_raised_at_once():
    calls = []

    @control_plane
    def refused() -> None:
        calls.append(1)
        raise api_error(400, "bad parameter")

    with pytest.raises(docker.errors.APIError):
        refused()
    assert len(calls) == 1
