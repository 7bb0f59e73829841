"""A line channel over a container's attached stdin/stdout (Docker's hijacked attach stream).

Without a TTY, Docker multiplexes the container's stdout and stderr on one stream in frames:
an 8-byte header (stream id, 3 zero bytes, big-endian payload length) and the payload. Stdout
frames carry the shim's protocol lines; stderr frames are kept as a bounded tail for error
messages.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from softprobe.gym.shim.client import LineBuffer

STDERR_TAIL_BYTES = 16 * 1024


class AttachChannel:
    """Implements ``LineChannel`` over an asyncio stream pair bound to the attach socket."""

    kind = "attach"

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        keepalive: Any,
        max_line_bytes: int,
    ) -> None:
        self._reader = reader
        self._writer = writer
        # The HTTP response that owns the hijacked socket: dropping it would close the socket.
        self._keepalive = keepalive
        self._stdout = LineBuffer(max_line_bytes)
        self._stderr = bytearray()
        self._closed = False

    @classmethod
    async def open(cls, attach_socket: Any, *, max_line_bytes: int) -> AttachChannel:
        raw: socket.socket = getattr(attach_socket, "_sock", attach_socket)
        if not isinstance(raw, socket.socket):
            raise TypeError(
                "this Docker transport does not expose a socket for attach streams; "
                "use a unix:// or tcp:// DOCKER_HOST"
            )
        raw.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=raw, limit=1 << 20)
        return cls(reader, writer, keepalive=attach_socket, max_line_bytes=max_line_bytes)

    async def send_line(self, line: bytes) -> None:
        self._writer.write(line + b"\n")
        await self._writer.drain()

    async def recv_line(self) -> bytes:
        while (line := self._stdout.take()) is None:
            try:
                header = await self._reader.readexactly(8)
                payload = await self._reader.readexactly(int.from_bytes(header[4:8], "big"))
            except asyncio.IncompleteReadError:
                raise EOFError("the container's output stream ended") from None
            if header[0] == 2:
                self._stderr += payload
                del self._stderr[:-STDERR_TAIL_BYTES]
            else:
                self._stdout.data += payload
        return line

    def diagnostics(self) -> str:
        text = self._stderr.decode("utf-8", "replace").strip()
        return text[-2000:]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        close = getattr(self._keepalive, "close", None)
        if close is not None:
            try:
                close()
            except OSError:
                pass
