"""The egress proxy's HTTP tape, run in this process on loopback: under ``record`` every plain
request is journaled (canonical request, digest, whole response) before the client has its
answer; under ``replay`` the same request is answered from the tape with the origin gone, a
changed one gets ``502 replay_miss`` naming its digest, and ``CONNECT`` is refused. The proxy's
canonical form and digest are the tape's (tapes/http.py, tapes/canonical.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from softprobe.gym.providers.docker import egress_proxy
from softprobe.gym.providers.docker.egress_proxy import Proxy
from softprobe.gym.tapes.canonical import canonical_digest, canonical_json
from softprobe.gym.tapes.http import HOP_HEADERS, canonical_http_request


async def _origin(seen: list[bytes]) -> tuple[asyncio.AbstractServer, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        body = await reader.readexactly(length)
        seen.append(head + body)
        reply = b"echo:" + head.split(b"\r\n")[0] + b"|" + body
        writer.write(b"HTTP/1.0 201 Made\r\nX-Origin: yes\r\nContent-Length: %d\r\n\r\n%s" % (len(reply), reply))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _ask(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def _through(allow: set[str], folder: Path, control: dict, requests: list[bytes]) -> list[bytes]:
    (folder / "control.json").write_bytes(canonical_json(control))
    server = await asyncio.start_server(Proxy(allow, str(folder)).serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return [await _ask(port, r) for r in requests]
    finally:
        server.close()
        await server.wait_closed()


def _journal(folder: Path) -> list[dict]:
    path = folder / "journal.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    path.unlink(missing_ok=True)
    return lines


def _get(port: int, path: str = "/a?q=1") -> bytes:
    return f"GET http://localhost:{port}{path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: t\r\n" \
           f"Proxy-Connection: keep-alive\r\n\r\n".encode()


def _post(port: int, body: bytes) -> bytes:
    return (f"POST http://localhost:{port}/p HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def test_record_then_replay_without_the_origin(tmp_path, capsys):
    egress_proxy._counts.update(logged=0, suppressed=0)
    seen: list[bytes] = []
    origin, port = await _origin(seen)
    allow = {f"localhost:{port}"}
    try:
        live = await _through(allow, tmp_path, {"mode": "record", "body_cap": 1000},
                              [_get(port), _post(port, b"\xff\x00binary"), _post(port, b"x" * 2000)])
    finally:
        origin.close()
        await origin.wait_closed()
    assert [a.split(b"\r\n")[0] for a in live] == [b"HTTP/1.0 201 Made"] * 3
    assert len(seen) == 3  # each went out once
    exchanges = _journal(tmp_path)
    assert [e["event"] for e in exchanges] == ["exchange", "exchange", "live"]
    assert exchanges[2]["note"] == "request_not_journaled"  # a body past the cap: not journaled, said so
    get, post = exchanges[0], exchanges[1]
    assert get["operation"] == f"GET localhost:{port}"
    assert get["request"] == canonical_http_request(
        "GET", f"http://localhost:{port}/a?q=1", [("Host", "localhost"), ("User-Agent", "t"),
                                                  ("Proxy-Connection", "keep-alive")], b"")
    assert get["digest"] == canonical_digest(get["request"])  # the proxy's digest is the tape's
    assert post["request"]["body_encoding"] == "base64" and post["response"]["status"] == 201
    assert all(name not in HOP_HEADERS for name, _ in post["request"]["headers"])

    # Replay: the origin is gone; the same requests get the recorded answers, byte for byte.
    replay = [{"sequence": i, "digest": e["digest"], "response": e["response"]} for i, e in enumerate(exchanges[:2])]
    answers = await _through(allow, tmp_path, {"mode": "replay", "replay": replay}, [
        _post(port, b"\xff\x00binary"), _get(port), _get(port), _get(port, "/changed"),
        f"CONNECT localhost:{port} HTTP/1.1\r\n\r\n".encode()])
    assert answers[0] == live[1] and answers[1] == live[0]
    assert answers[2].startswith(b"HTTP/1.1 502") and b"replay_miss" in answers[2]  # consumed: once only
    assert answers[3].startswith(b"HTTP/1.1 502") and b"X-Softprobe-Digest: sha256:" in answers[3]
    assert answers[4].startswith(b"HTTP/1.1 403")  # a tunnel cannot be replayed: refused
    lines = _journal(tmp_path)
    assert [line["event"] for line in lines] == ["served", "served", "miss", "miss", "connect"]
    assert [line.get("sequence") for line in lines[:2]] == [1, 0]
    assert lines[3]["request"]["url"].endswith("/changed") and lines[3]["digest"].encode() in answers[3]
    assert lines[4] == {"event": "connect", "operation": f"CONNECT localhost:{port}", "refused": True}
    assert len(seen) == 3  # replay never went out


async def test_without_control_the_proxy_only_logs(tmp_path, capsys):
    egress_proxy._counts.update(logged=0, suppressed=0)
    seen: list[bytes] = []
    origin, port = await _origin(seen)
    server = await asyncio.start_server(Proxy({f"localhost:{port}"}, str(tmp_path)).serve, "127.0.0.1", 0)
    try:
        (answer,) = [await _ask(server.sockets[0].getsockname()[1], _get(port))]
    finally:
        server.close()
        origin.close()
    assert answer.startswith(b"HTTP/1.0 201") and not (tmp_path / "journal.jsonl").exists()
