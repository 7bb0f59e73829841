"""The host side of the shim protocol, independent of where the container runs."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, Protocol

from pydantic import ValidationError

from ..errors import SandboxError, SandboxLostError
from .protocol import (
    CallRequest,
    CallResult,
    ExistsRequest,
    HelloRequest,
    HelloResult,
    ReadTextRequest,
    RescanRequest,
    RescanResult,
    SeedRequest,
    ShimRequest,
    ShimResponse,
)

#: How long the host waits beyond a tool's own timeout before it declares the shim unresponsive.
RESPONSE_GRACE_S = 15.0

_timeout = getattr(asyncio, "timeout", None)


class LineChannel(Protocol):
    """A duplex byte channel carrying one message per line (the transport under the client)."""

    async def send_line(self, line: bytes) -> None: ...

    async def recv_line(self) -> bytes:
        """Return the next line without its newline; raise EOFError when the peer is gone."""
        ...

    def diagnostics(self) -> str:
        """Whatever the transport knows about a failure (e.g. the shim's last stderr lines)."""
        ...

    def close(self) -> None: ...


class ShimClient:
    """Sends requests to one shim and returns their results, one request at a time.

    Raises:
        SandboxLostError: the channel closed, or no answer came within the request's deadline.
            The connection is unusable after this; the episode must be reset.
        SandboxError: the shim refused the request (a protocol error on our side).
    """

    def __init__(self, channel: LineChannel) -> None:
        self._channel = channel
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._lost: str | None = None

    @property
    def lost(self) -> str | None:
        """Why the connection was lost, or None while it works."""
        return self._lost

    async def hello(self, *, timeout_s: float) -> HelloResult:
        return HelloResult.model_validate(await self._request(HelloRequest(), timeout_s))

    async def call_tool(
        self, *, tool: str, args: dict[str, Any], timeout_s: float, output_cap: int
    ) -> CallResult:
        request = CallRequest(tool=tool, args=args, timeout_s=timeout_s, output_cap=output_cap)
        return CallResult.model_validate(await self._request(request, timeout_s + RESPONSE_GRACE_S))

    async def seed(self, archive: bytes) -> HelloResult:
        """Have the shim extract a tar of seed files into the workspace; return its new hello."""
        request = SeedRequest(archive=base64.b64encode(archive).decode("ascii"))
        return HelloResult.model_validate(await self._request(request, RESPONSE_GRACE_S + 60))

    async def exists(self, path: str) -> bool:
        return bool(await self._request(ExistsRequest(path=path), RESPONSE_GRACE_S))

    async def read_text(self, path: str, *, max_bytes: int) -> str:
        result = await self._request(ReadTextRequest(path=path, max_bytes=max_bytes), RESPONSE_GRACE_S)
        return str(result)

    async def rescan(self) -> RescanResult:
        return RescanResult.model_validate(await self._request(RescanRequest(), RESPONSE_GRACE_S + 120))

    def close(self) -> None:
        self._channel.close()

    async def _request(self, request: ShimRequest, deadline_s: float) -> Any:
        async with self._lock:
            if self._lost is not None:
                raise SandboxLostError(self._lost)
            self._next_id += 1
            request_id = self._next_id
            payload = request.model_dump()
            payload["id"] = request_id
            line = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            try:
                if _timeout is not None:  # no extra task per request (Python >= 3.11)
                    async with _timeout(deadline_s):
                        response = await self._exchange(line, request_id)
                else:
                    response = await asyncio.wait_for(self._exchange(line, request_id), deadline_s)
            except asyncio.TimeoutError:
                raise self._fail(f"the shim did not answer within {deadline_s:g}s") from None
            except (EOFError, ConnectionError, OSError) as err:
                detail = f" ({err})" if str(err) else ""
                raise self._fail(f"the connection to the shim closed{detail}") from None
        if not response.ok:
            failure = response.error
            raise SandboxError(
                f"the shim refused a {request.op!r} request: "
                f"{failure.type if failure else '?'}: {failure.message if failure else ''}"
            )
        return response.result

    async def _exchange(self, line: bytes, request_id: int) -> ShimResponse:
        await self._channel.send_line(line)
        while True:
            raw = await self._channel.recv_line()
            try:
                response = ShimResponse.model_validate_json(raw)
            except ValidationError as err:
                raise EOFError(f"unreadable message from the shim: {err.errors()[0]['msg']}") from None
            # id None: the shim could not even read the request's id.
            if response.id == request_id or response.id is None:
                return response

    def _fail(self, reason: str) -> SandboxLostError:
        """Mark the connection lost for good (a late answer would be misattributed)."""
        extra = self._channel.diagnostics()
        self._lost = reason + (f"; shim stderr: {extra}" if extra else "")
        self._channel.close()
        return SandboxLostError(self._lost)
