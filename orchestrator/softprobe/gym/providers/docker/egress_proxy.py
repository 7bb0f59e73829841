"""The per-episode egress proxy: the only way out of a world whose network policy is ``egress``.

Runs inside its own container (stdlib only, started as ``python3 -I -c <this file>``), attached
to the episode's private network and to the provider's egress network. It forwards plain HTTP
requests (absolute-form, one request per connection) and ``CONNECT`` tunnels to the
``host:port`` pairs given as its arguments (``*:port``: any public address), and refuses
everything else with ``403``. Every
decision is one JSON line on stdout, which the host reads back as the episode's egress report.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import sys
from collections.abc import Mapping
from urllib.parse import urlsplit

#: The most a request head may take; larger heads are refused (431), so a client cannot make
#: the proxy buffer without bound.
MAX_HEAD_BYTES = 64 * 1024
#: How long a client has to send its request head.
HEAD_TIMEOUT_S = 30.0
#: How long connecting to an allowed destination may take.
CONNECT_TIMEOUT_S = 10.0
PORT = 3128
#: Decisions recorded one by one; after these only their number is (a line per SUPPRESSED_EVERY),
#: so a flood can neither push the first decisions out of the bounded log nor fill it: a record
#: is at most ~700 bytes in Docker's log, so these take ~3.5 MB of its 16 MB.
MAX_LOGGED = 5000
SUPPRESSED_EVERY = 1000
_counts = {"logged": 0, "suppressed": 0}


def log(event: str, destination: str, method: str, detail: str = "", address: str = "") -> None:
    """One decision as a JSON line on stdout (the host's egress report)."""
    if event != "listening" and _counts["logged"] >= MAX_LOGGED:
        _counts["suppressed"] += 1
        if _counts["suppressed"] % SUPPRESSED_EVERY == 1:
            emit({"event": "suppressed", "count": _counts["suppressed"]})
        return
    _counts["logged"] += event != "listening"
    record = {"event": event, "destination": _plain(destination, 256), "method": _plain(method, 16)}
    if detail:
        record["detail"] = _plain(detail, 200)
    if address:
        record["address"] = _plain(address, 64)
    emit(record)


def _plain(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` printable ASCII characters, nothing JSON must escape: so a
    record's size in the log (escaped twice: by us, then by Docker's log driver) is bounded by
    its length, and MAX_LOGGED records stay far below the log's size cap."""
    return "".join(c if " " <= c <= "~" and c not in '"\\' else "?" for c in text[:limit])


def emit(record: Mapping[str, object]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


class Proxy:
    """Serves one listening socket; ``allow`` holds lower-case ``host:port`` (``*:port`` too)."""

    def __init__(self, allow: set[str]) -> None:
        self.allow = allow

    def rule(self, host: str, port: int) -> str | None:
        """``"named"`` (the host is listed), ``"any"`` (only ``*:port`` is), or None."""
        if f"{host.lower()}:{port}" in self.allow:
            return "named"
        return "any" if f"*:{port}" in self.allow else None

    async def resolve(self, host: str, port: int, rule: str) -> str:
        """The one address connected to (so a second lookup cannot swap it). A ``*:port`` rule
        reaches public addresses only: never this machine, a private network or a metadata
        service, however the host is spelled (an integer, a name that resolves there)."""
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        address = str(infos[0][4][0])
        if rule == "any" and not ipaddress.ip_address(address).is_global:
            raise PermissionError(f"{address} is not a public address (a *:{port} rule reaches public ones only)")
        return address

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
            await self.refuse(writer, 431, "-", "-", "request head too large")
            return
        request_line, _, rest = head.partition(b"\r\n")
        parts = request_line.decode("latin-1").split(" ")
        if len(parts) != 3:
            await self.refuse(writer, 400, request_line.decode("latin-1"), "-", "malformed request line")
            return
        method, target, version = parts
        try:
            if method == "CONNECT":
                host, _, port_text = target.rpartition(":")
                destination = target
                if not port_text.isdigit() or not host:
                    raise ValueError("CONNECT needs host:port")
                port = int(port_text)
            else:
                url = urlsplit(target)
                if url.scheme != "http" or not url.hostname:
                    raise ValueError("only absolute http:// URLs and CONNECT are proxied")
                host, port = url.hostname, url.port or 80
                destination = f"{host}:{port}"
            if not 0 < port < 65536:
                raise ValueError("port out of range")
        except ValueError as err:
            await self.refuse(writer, 400, target, method, str(err))
            return
        rule = self.rule(host, port)
        if rule is None:
            await self.refuse(writer, 403, destination, method, "not on the allow-list")
            return
        try:
            address = await self.resolve(host, port, rule)
        except PermissionError as err:
            await self.refuse(writer, 403, destination, method, str(err))
            return
        except (OSError, ValueError) as err:  # ValueError: a name IDNA cannot encode
            log("failed", destination, method, f"cannot resolve: {err}")
            await reply(writer, 502, f"cannot resolve {destination}")
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(address, port), CONNECT_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as err:
            log("failed", destination, method, str(err) or type(err).__name__, address)
            await reply(writer, 502, f"cannot reach {destination}")
            return
        log("allowed", destination, method, address=address)
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

    @staticmethod
    async def refuse(writer: asyncio.StreamWriter, status: int, destination: str, method: str, why: str) -> None:
        log("refused", destination, method, why)
        await reply(writer, status, f"egress to {destination} refused: {why}" if status == 403 else why)


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
