"""The egress proxy's decisions, run in this process on loopback: allowed destinations are
forwarded, everything else refused and recorded; a ``*:port`` rule never reaches a private or
loopback address however it is spelled; a flood cannot push early decisions out of the record.
(The proxy in its container, between real networks, is tested in tests/docker/test_worlds.py.)"""

from __future__ import annotations

import asyncio
import json

import pytest

from softprobe.gym.providers.docker import egress_proxy
from softprobe.gym.providers.docker.egress_proxy import Proxy


async def _origin() -> tuple[asyncio.AbstractServer, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        body = head.split(b"\r\n")[0]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _ask(proxy_port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


@pytest.fixture
def decisions(capsys):
    def read() -> list[dict]:
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    egress_proxy._counts.update(logged=0, suppressed=0)
    return read


async def _with_proxy(allow: set[str], requests: list[bytes]) -> list[bytes]:
    server = await asyncio.start_server(Proxy(allow).serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return [await _ask(port, r) for r in requests]
    finally:
        server.close()
        await server.wait_closed()


async def test_named_destinations_are_forwarded_and_the_rest_refused(decisions):
    origin, port = await _origin()
    try:
        answers = await _with_proxy({f"localhost:{port}"}, [
            f"GET http://localhost:{port}/path?q=1 HTTP/1.1\r\nHost: localhost\r\n\r\n".encode(),
            f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n".encode(),  # the same server, not by its listed name
            f"CONNECT localhost:{port + 1 if port < 65535 else 1} HTTP/1.1\r\n\r\n".encode(),
        ])
    finally:
        origin.close()
    assert answers[0].startswith(b"HTTP/1.1 200") and answers[0].endswith(b"GET /path?q=1 HTTP/1.1")
    assert answers[1].startswith(b"HTTP/1.1 403") and answers[2].startswith(b"HTTP/1.1 403")
    recorded = decisions()
    assert [(d["event"], d["destination"]) for d in recorded] == [
        ("allowed", f"localhost:{port}"), ("refused", f"127.0.0.1:{port}"),
        ("refused", f"localhost:{port + 1 if port < 65535 else 1}")]
    assert recorded[0]["address"] == "127.0.0.1"


@pytest.mark.parametrize("host", ["127.0.0.1", "2130706433", "localhost", "0x7f.1", "10.0.0.1", "169.254.169.254"])
async def test_a_wildcard_rule_reaches_no_private_or_loopback_address(host, decisions):
    origin, port = await _origin()
    try:
        (answer,) = await _with_proxy({f"*:{port}"}, [f"CONNECT {host}:{port} HTTP/1.1\r\n\r\n".encode()])
    finally:
        origin.close()
    assert answer.startswith(b"HTTP/1.1 403") or answer.startswith(b"HTTP/1.1 502")  # 502: a name that does not resolve
    assert not answer.startswith(b"HTTP/1.1 200")
    assert all(d["event"] != "allowed" for d in decisions())


@pytest.mark.parametrize("request_line", [
    b"GET http://h:70000/ HTTP/1.1", b"GET http://[h/ HTTP/1.1", b"CONNECT h HTTP/1.1", b"BROKEN",
    b"GET /relative HTTP/1.1", b"GET ftp://h/ HTTP/1.1",
])
async def test_malformed_requests_are_refused_and_recorded(request_line, decisions):
    (answer,) = await _with_proxy({"h:80"}, [request_line + b"\r\n\r\n"])
    assert answer.startswith(b"HTTP/1.1 400")
    assert [d["event"] for d in decisions()] == ["refused"]


async def test_a_flood_cannot_push_the_first_decisions_out(decisions, monkeypatch):
    monkeypatch.setattr(egress_proxy, "MAX_LOGGED", 5)
    monkeypatch.setattr(egress_proxy, "SUPPRESSED_EVERY", 10)
    origin, port = await _origin()
    try:
        await _with_proxy({f"localhost:{port}"}, [
            f"GET http://localhost:{port}/secret HTTP/1.1\r\n\r\n".encode(),
            *[f"CONNECT flood-{i}:1 HTTP/1.1\r\n\r\n".encode() for i in range(30)],
        ])
    finally:
        origin.close()
    recorded = decisions()
    assert recorded[0]["event"] == "allowed"  # the early, interesting one stays
    assert sum(1 for d in recorded if d["event"] in ("allowed", "refused")) == 5
    assert [d["count"] for d in recorded if d["event"] == "suppressed"] == [1, 11, 21]


async def test_a_record_stays_short_and_plain_whatever_the_request_holds(decisions):
    # Non-ASCII, quotes and backslashes would grow when escaped (by us, then by Docker's log).
    method = "\u00ff\"\\" * 300
    await _with_proxy({"h:80"}, [f"{method} http://h:{'9' * 400}/ HTTP/1.1\r\n\r\n".encode()])
    (record,) = decisions()
    line = json.dumps(record)
    assert record["event"] == "refused" and len(line) < 700 and line.isascii() and "\\" not in line
