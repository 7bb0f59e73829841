"""A unix-socket proxy in front of the real Docker engine that fails its first connections.

For the transient-error test (SECURITY.md row 17): the first ``http_500`` new connections get
``HTTP/1.1 500`` and are closed, the next ``resets`` are closed without an answer; every later
connection is piped to the real engine byte for byte (attach streams included). It runs on its
own thread and event loop, listens only on a socket file in a temporary folder, and stops with
the context manager.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

ENGINE = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")  # the engine under test


class FaultyDockerProxy:
    def __init__(self, socket_path: Path, *, http_500: int = 0, resets: int = 0) -> None:
        self.socket_path = socket_path
        self.http_500 = http_500
        self.resets = resets
        self.failed = 0
        self.forwarded = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def __enter__(self) -> FaultyDockerProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.socket_path))

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if self.http_500 > 0:
                self.http_500 -= 1
                self.failed += 1
                await reader.readuntil(b"\r\n\r\n")
                body = b'{"message": "injected failure"}'
                writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                             b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                return
            if self.resets > 0:
                self.resets -= 1
                self.failed += 1
                return
            self.forwarded += 1
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(ENGINE)
            await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()
