"""A line channel over a subprocess's stdin and stdout (and a bounded tail of its stderr)."""

from __future__ import annotations

import asyncio
import contextlib

from softprobe.gym.shim.client import LineBuffer

STDERR_TAIL_BYTES = 16 * 1024


class PipeChannel:
    """Implements ``LineChannel`` over an asyncio subprocess started with three pipes."""

    kind = "pipe"

    def __init__(self, process: asyncio.subprocess.Process, *, max_line_bytes: int) -> None:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        self._process = process
        self._stdin = process.stdin
        self._stdout = process.stdout
        self._buffer = LineBuffer(max_line_bytes)
        self._stderr = bytearray()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(process.stderr))
        self._closed = False

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self._stderr += chunk
            del self._stderr[:-STDERR_TAIL_BYTES]

    async def send_line(self, line: bytes) -> None:
        self._stdin.write(line + b"\n")
        await self._stdin.drain()

    async def recv_line(self) -> bytes:
        while (line := self._buffer.take()) is None:
            chunk = await self._stdout.read(1 << 20)
            if not chunk:
                raise EOFError("the shim's output stream ended")
            self._buffer.data += chunk
        return line

    def diagnostics(self) -> str:
        return self._stderr.decode("utf-8", "replace").strip()[-2000:]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._stdin.close()
        self._stderr_task.cancel()


__all__ = ["PipeChannel"]
