"""The per-episode egress proxy: the only way out of a world whose network policy is ``egress``.

Runs inside its own container (stdlib only, started as ``python3 -I -c <this file>``), attached
to the episode's private network and to the provider's egress network. It forwards plain HTTP
requests (absolute-form, one request per connection) and ``CONNECT`` tunnels to the
``host:port`` pairs given with ``--allow``, and refuses everything else with ``403``. Every
decision is one JSON line on stdout, which the host reads back as the episode's egress report.
"""

from __future__ import annotations

import asyncio
import json
import sys
from urllib.parse import urlsplit

#: The most a request head may take; larger heads are refused (431), so a client cannot make
#: the proxy buffer without bound.
MAX_HEAD_BYTES = 64 * 1024
#: How long a client has to send its request head.
HEAD_TIMEOUT_S = 30.0
#: How long connecting to an allowed destination may take.
CONNECT_TIMEOUT_S = 10.0
PORT = 3128


def log(event: str, destination: str, method: str, detail: str = "") -> None:
    """One decision as a JSON line on stdout (the host's egress report)."""
    record = {"event": event, "destination": destination, "method": method[:16]}
    if detail:
        record["detail"] = detail[:200]
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


class Proxy:
    """Serves one listening socket; ``allow`` holds lower-case ``host:port`` (``*:port`` too)."""

    def __init__(self, allow: set[str]) -> None:
        self.allow = allow

    def allowed(self, host: str, port: int) -> bool:
        return f"{host.lower()}:{port}" in self.allow or f"*:{port}" in self.allow

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            await reply(writer, 431, "request head too large")
            return
        request_line, _, rest = head.partition(b"\r\n")
        parts = request_line.decode("latin-1").split(" ")
        if len(parts) != 3:
            await reply(writer, 400, "malformed request line")
            return
        method, target, version = parts
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            destination = target
            if not port_text.isdigit() or not host:
                await reply(writer, 400, "CONNECT needs host:port")
                return
            port = int(port_text)
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                log("refused", target[:200], method, "not an absolute http:// URL")
                await reply(writer, 400, "only absolute http:// URLs and CONNECT are proxied")
                return
            host, port = url.hostname, url.port or 80
            destination = f"{host}:{port}"
        if not self.allowed(host, port):
            log("refused", destination, method, "not on the allow-list")
            await reply(writer, 403, f"egress to {destination} is not allowed by the episode's network policy")
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as err:
            log("failed", destination, method, str(err) or type(err).__name__)
            await reply(writer, 502, f"cannot reach {destination}")
            return
        log("allowed", destination, method)
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            path = urlsplit(target).path or "/"
            query = urlsplit(target).query
            origin = path + ("?" + query if query else "")
            headers = [line for line in rest.split(b"\r\n") if line and not line.lower().startswith(
                (b"proxy-connection:", b"connection:", b"keep-alive:"))]
            up_writer.write(f"{method} {origin} {version}\r\n".encode("latin-1") + b"\r\n".join(
                [*headers, b"Connection: close"]) + b"\r\n\r\n")
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of file, then close the writing side."""
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except OSError:
        pass
    finally:
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            writer.close()


async def reply(writer: asyncio.StreamWriter, status: int, message: str) -> None:
    body = json.dumps({"error": "egress_refused" if status == 403 else "proxy_error", "message": message}).encode()
    reason = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large", 502: "Bad Gateway"}
    writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 b"Connection: close\r\n\r\n%s" % (status, reason[status].encode(), len(body), body))
    await writer.drain()


async def main(argv: list[str]) -> None:
    allow = {item.lower() for item in argv if item}
    proxy = Proxy(allow)
    server = await asyncio.start_server(proxy.serve, "0.0.0.0", PORT, limit=MAX_HEAD_BYTES)
    log("listening", f"0.0.0.0:{PORT}", "-")
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
