"""The host side of the shim protocol, independent of where the container runs."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from softprobe.gym.actions import wire_json
from softprobe.gym.errors import SandboxError, SandboxLostError, ShimReplyError
from softprobe.gym.shim.protocol import (
    MAX_RAW_BYTES,
    ApplyChangesRequest,
    ApplyChangesResult,
    CallResult,
    ChannelRequest,
    ChannelResult,
    CloseSessionsRequest,
    EpisodeEnvRequest,
    ExecReply,
    ExecRequest,
    ExistsRequest,
    ExportChangesRequest,
    ExportChangesResult,
    HelloRequest,
    HelloResult,
    OverlayRequest,
    PutFilesRequest,
    PutFilesResult,
    ReadTextRequest,
    RescanRequest,
    RescanResult,
    SeedRequest,
    ShimRequest,
    ShimResponse,
    VerifyRequest,
    VerifyResult,
    WorkspaceRestoreRequest,
    WorkspaceSnapshotRequest,
    WorkspaceSnapshotResult,
    WorkspaceStageRequest,
    WorkspaceStageResult,
)
from softprobe.gym.shim.replies import MAX_OBSERVATION_DEPTH, bounded_observation, prune_deep_json
from softprobe.gym.text import readable

#: How long the host waits beyond a tool's own timeout before it declares the shim unresponsive.
RESPONSE_GRACE_S = 15.0
#: The longest line any channel takes from a shim (a reply with a large observation).
MAX_LINE_BYTES = 256 * 1024 * 1024

_timeout = getattr(asyncio, "timeout", None)

_Model = TypeVar("_Model", bound=BaseModel)

#: The deepest a reply line is read when the fast parser refused it: a reply holds an observation
#: two levels down, so one nested deeper is still seen to be over its limit (and any parser,
#: on any stack, reads this deep).
_REPLY_PARSE_DEPTH = 2 * MAX_OBSERVATION_DEPTH


class ShimRefusedError(SandboxError):
    """The shim refused a request (our side sent something it does not accept).

    Attributes:
        kind: the shim's error type (``protocol_error``, ``tool_conflict``, ``invalid_tool``, ...).
        detail: the shim's message.
    """

    def __init__(self, message: str, *, kind: str, detail: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = detail


class LineChannel(Protocol):
    """A duplex byte channel carrying one message per line (the transport under the client).

    Attributes:
        kind: what carries it, named in each step's diagnostics (``channel``): ``attach``
            (Docker's attach relay), ``direct`` (a unix socket to the shim, local engines) or
            ``pipe`` (a local subprocess).
    """

    kind: str

    async def send_line(self, line: bytes) -> None:
        """Send ``line`` and a newline, every byte as it is: a request with raw content passes
        its line, a newline and the content as one ``line`` (the content may hold newlines)."""
        ...

    async def recv_line(self) -> bytes:
        """Return the next line without its newline; raise EOFError when the peer is gone."""
        ...

    def diagnostics(self) -> str:
        """Whatever the transport knows about a failure (e.g. the shim's last stderr lines)."""
        ...

    def close(self) -> None: ...


class LineBuffer:
    """What a channel has read from the shim, split into lines; each byte is searched for a
    newline once, so a line that never ends costs linear time, not quadratic."""

    def __init__(self, max_line_bytes: int) -> None:
        self.data = bytearray()
        self._scanned = 0  # bytes of ``data`` known to hold no newline
        self._max_line_bytes = max_line_bytes

    def take(self) -> bytes | None:
        """The first whole line (removed, without its newline), or None while there is none.

        Raises:
            EOFError: more than ``max_line_bytes`` without a newline.
        """
        newline = self.data.find(b"\n", self._scanned)
        if newline >= 0:
            line = bytes(self.data[:newline])
            del self.data[: newline + 1]
            self._scanned = 0
            return line
        self._scanned = len(self.data)
        if self._scanned > self._max_line_bytes:
            raise EOFError(f"a message from the shim exceeded {self._max_line_bytes} bytes")
        return None


class ShimClient:
    """Sends requests to one shim and returns their results, one request at a time.

    Raises:
        SandboxLostError: the channel closed, or no answer came within the request's deadline.
            The connection is unusable after this; the episode must be reset.
        ShimReplyError: the answer could not be read (not strict JSON, or not the shape the
            protocol defines). Only that request failed; the connection stays usable.
        ShimRefusedError: the shim refused the request (a protocol error on our side).
        SandboxError: the request could not be encoded.

    Every string of a reply reaches the caller as readable text: lone surrogates (file names
    that are not UTF-8) become backslash escapes, so results can always be written as JSON.
    """

    def __init__(self, channel: LineChannel) -> None:
        self._channel = channel
        self._lock = asyncio.Lock()
        self._next_id = 0
        self._lost: str | None = None
        self._lost_stream_ended = False

    @property
    def lost(self) -> str | None:
        """Why the connection was lost, or None while it works."""
        return self._lost

    async def channel(self, nonce: str, *, timeout_s: float) -> ChannelResult:
        """Ask the shim to connect to the host's socket, sending ``nonce`` there (see
        ``ChannelRequest``); whether it did. Before ``hello``."""
        return _validated(ChannelResult, await self._request(ChannelRequest(nonce=nonce), timeout_s), "channel")

    async def hello(self, *, timeout_s: float) -> HelloResult:
        return _validated(HelloResult, await self._request(HelloRequest(), timeout_s), "hello")

    async def call_tool(
        self, *, tool: str, args: dict[str, Any], timeout_s: float, output_cap: int, traceparent: str | None = None
    ) -> CallResult:
        # The hot path: the request is ours (a CallRequest's fields, built here from checked
        # values), so it goes out as a plain dict without a model's validate-and-dump round.
        request = {"op": "call", "tool": tool, "args": args, "timeout_s": timeout_s, "output_cap": output_cap,
                   "traceparent": traceparent}
        call = _validated(CallResult, await self._request(request, timeout_s + RESPONSE_GRACE_S), "call")
        return bounded_observation(call, tool)

    async def seed(self, archive: bytes) -> HelloResult:
        """Have the shim extract a tar of seed files into the workspace; return its new hello."""
        return _validated(HelloResult, await self._request(SeedRequest(), RESPONSE_GRACE_S + 60, raw=archive), "seed")

    async def overlay(
        self, tools: dict[str, dict[str, Any]], archive: bytes, mcp_servers: list[dict[str, Any]] | None = None
    ) -> HelloResult:
        """Have the shim add ``tools`` (manifest entries) and ``mcp_servers`` (MCP servers whose
        tools it lists) and extract ``archive`` (a tar, names relative to its overlay folder, or
        empty); return its new hello. Once per sandbox."""
        request = OverlayRequest(tools=tools, archive=base64.b64encode(archive).decode("ascii"),
                                 mcp_servers=mcp_servers or [])
        return _validated(HelloResult, await self._request(request, RESPONSE_GRACE_S + 60), "overlay")

    async def episode_env(self, *, clock_start: int | None, random_seed: int | None) -> HelloResult:
        """Have the shim fix the clock start and random seed of the processes it starts; return
        its hello. Once per sandbox, before any call."""
        request = EpisodeEnvRequest(clock_start=clock_start, random_seed=random_seed)
        return _validated(HelloResult, await self._request(request, RESPONSE_GRACE_S), "episode_env")

    async def exists(self, path: str) -> bool:
        return bool(await self._request(ExistsRequest(path=path), RESPONSE_GRACE_S))

    async def read_text(self, path: str, *, max_bytes: int) -> str:
        result = await self._request(ReadTextRequest(path=path, max_bytes=max_bytes), RESPONSE_GRACE_S)
        return str(result)

    async def rescan(self, zero_paths: list[str] | None = None) -> RescanResult:
        result = await self._request(RescanRequest(zero_paths=zero_paths), RESPONSE_GRACE_S + 120)
        return _validated(RescanResult, result, "rescan")

    async def close_sessions(self) -> list[str]:
        """Close every persistent session (its processes killed); the names of those closed."""
        result = await self._request(CloseSessionsRequest(), RESPONSE_GRACE_S + 30)
        if not isinstance(result, list) or not all(isinstance(name, str) for name in result):
            raise ShimReplyError(f"close_sessions: the shim answered {readable(result)!r}, not a list of names")
        return result

    async def export_changes(self, *, max_bytes: int) -> ExportChangesResult:
        """What the last call changed in the workspace (see ``ExportChangesRequest``)."""
        result = await self._request(ExportChangesRequest(max_bytes=max_bytes), RESPONSE_GRACE_S + 60)
        return _validated(ExportChangesResult, result, "export_changes")

    async def apply_changes(self, changes: list[dict[str, Any]]) -> ApplyChangesResult:
        """Apply a recorded change set; a refused one raises ShimRefusedError (kind
        ``change_set_refused``), nothing changed."""
        result = await self._request(ApplyChangesRequest(changes=changes), RESPONSE_GRACE_S + 60)
        return _validated(ApplyChangesResult, result, "apply_changes")

    async def workspace_snapshot(self, request: WorkspaceSnapshotRequest) -> WorkspaceSnapshotResult:
        """One chunk of the workspace's snapshot (see ``WorkspaceSnapshotRequest``);
        ShimRefusedError (``workspace_unsupported``, ``over_budget``, ``processes_survive``)
        when it cannot be taken."""
        result = await self._request(request, RESPONSE_GRACE_S + 120)
        return _validated(WorkspaceSnapshotResult, result, "workspace_snapshot")

    async def workspace_stage(self, request: WorkspaceStageRequest, data: bytes) -> WorkspaceStageResult:
        """Stage pieces of blobs for a workspace restore (see ``WorkspaceStageRequest``);
        ``data``: the pieces' content, one after the other."""
        result = await self._request(request, RESPONSE_GRACE_S + 60, raw=data)
        return _validated(WorkspaceStageResult, result, "workspace_stage")

    async def workspace_restore(self, changes: list[dict[str, Any]]) -> HelloResult:
        """Make the workspace exactly ``changes`` (see ``WorkspaceRestoreRequest``); the new hello."""
        result = await self._request(WorkspaceRestoreRequest(changes=changes), RESPONSE_GRACE_S + 120)
        return _validated(HelloResult, result, "workspace_restore")

    async def exec(self, request: ExecRequest, stdin: bytes) -> ExecReply:
        """Run one program for the host (see ``ExecRequest``) with ``stdin`` as its input."""
        return _validated(ExecReply, await self._request(request, _program_deadline(request, stdin), raw=stdin), "exec")

    async def put_files(self, request: PutFilesRequest, archive: bytes) -> PutFilesResult:
        """Place a tar of folders and files (see ``PutFilesRequest``)."""
        result = await self._request(request, RESPONSE_GRACE_S + 60 + len(archive) / (8 << 20), raw=archive)
        return _validated(PutFilesResult, result, "put_files")

    async def verify(self, request: VerifyRequest, archive: bytes) -> VerifyResult:
        """Run a world's verifier (see ``VerifyRequest``); ``archive``: a tar of its files."""
        result = await self._request(request, _program_deadline(request, archive) + 60, raw=archive)
        return _validated(VerifyResult, result, "verify")

    def close(self) -> None:
        self._channel.close()

    async def _request(
        self, request: ShimRequest | dict[str, Any], deadline_s: float, *, raw: bytes | None = None
    ) -> Any:
        """Send ``request`` (a model, or the dict of a model's fields with its ``op``), followed
        by ``raw`` content if given, and return its result."""
        op = request["op"] if isinstance(request, dict) else request.op
        async with self._lock:
            if self._lost is not None:
                raise SandboxLostError(self._lost, stream_ended=self._lost_stream_ended)
            self._next_id += 1
            request_id = self._next_id
            payload = request if isinstance(request, dict) else request.model_dump()
            payload["id"] = request_id
            if raw is not None:
                if len(raw) > MAX_RAW_BYTES:
                    raise SandboxError(
                        f"a {op!r} request would carry {len(raw)} bytes, over the {MAX_RAW_BYTES} the shim takes "
                        "at once; nothing was sent (use a smaller seed; on Docker, pool_size=0 copies the seed in "
                        "with the container)"
                    )
                payload["raw"] = len(raw)
            try:
                line = wire_json(payload)
            except (ValueError, TypeError, UnicodeEncodeError, RecursionError) as err:
                raise SandboxError(
                    f"a {op!r} request could not be encoded as JSON ({err}); nothing was sent"
                ) from None
            if raw is not None:  # the content as it is, after the request's line (see the shim)
                line = b"".join((line, b"\n", raw))
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
                raise self._fail(f"the connection to the shim closed{detail}", stream_ended=True) from None
        if not response.ok:
            kind, detail = (response.error.type, response.error.message) if response.error else ("?", "")
            message = f"the shim refused a {op!r} request: {kind}: {detail}"
            raise ShimRefusedError(message, kind=kind, detail=detail)
        return response.result

    async def _exchange(self, line: bytes, request_id: int) -> ShimResponse:
        await self._channel.send_line(line)
        while True:
            response = _parse_response(await self._channel.recv_line())
            # id None: the shim could not even read the request's id.
            if response.id == request_id or response.id is None:
                return response

    def _fail(self, reason: str, *, stream_ended: bool = False) -> SandboxLostError:
        """Mark the connection lost for good (a late answer would be misattributed)."""
        extra = self._channel.diagnostics()
        self._lost = reason + (f"; shim stderr: {extra}" if extra else "")
        self._lost_stream_ended = stream_ended
        self._channel.close()
        return SandboxLostError(self._lost, stream_ended=stream_ended)


def _parse_response(raw: bytes) -> ShimResponse:
    """One reply line as a response whose strings are all readable text.

    The fast parser (pydantic-core's) refuses ``NaN``/``Infinity`` and lone surrogates, so what
    it accepts is already readable. It rejects the ``\\udcff`` escapes the shim writes for
    bytes of a name that are not UTF-8, and lines nested deeper than its limit (a tool's JSON
    output); those lines go through the standard library's parser, which accepts the escapes,
    and :func:`readable` turns them into visible ``\\xff`` escapes. Before that, whatever is
    nested deeper than :data:`_REPLY_PARSE_DEPTH` is cut off: that parser's limit is what is left
    of the stack, and the observation is over its own limit anyway.

    Raises:
        ShimReplyError: the line is not strict JSON, or not a response.
    """
    try:
        data = from_json(raw, allow_inf_nan=False)
    except ValueError:
        try:
            data = readable(json.loads(prune_deep_json(raw, _REPLY_PARSE_DEPTH), parse_constant=_refuse_constant))
        except (ValueError, RecursionError) as err:
            raise ShimReplyError(
                f"a reply from the shim could not be read ({str(err)[:200]}); the request failed, "
                "the container is kept and the episode can go on"
            ) from None
    try:
        return ShimResponse.model_validate(data)
    except ValidationError as err:
        raise ShimReplyError(
            f"a reply from the shim is not a response ({err.errors()[0]['msg']}); the request "
            "failed, the container is kept and the episode can go on"
        ) from None


def _program_deadline(request: ExecRequest | VerifyRequest, content: bytes) -> float:
    """How long a program's request may take: its own time, then the transfer of what it
    carries and of both streams' tails (base64), at a pessimistic 8 MiB/s."""
    return request.timeout_s + RESPONSE_GRACE_S + (len(content) + 2 * request.output_cap) / (8 << 20)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _validated(model: type[_Model], result: object, op: str) -> _Model:
    try:
        return model.model_validate(result)
    except ValidationError as err:
        where = ".".join(str(p) for p in err.errors()[0]["loc"]) or "result"
        raise ShimReplyError(
            f"the shim's reply to a {op!r} request is not the protocol's shape ({where}: "
            f"{err.errors()[0]['msg']}); the request failed, the container is kept"
        ) from None
