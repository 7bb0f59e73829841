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


class _Sandbox:
    """A sandbox whose proxy journal is a byte string (pure logic: the real one is in tests/docker)."""

    sandbox_id = "sb-1"

    def __init__(self) -> None:
        self.journal = b""
        self.controls: list[dict] = []

    async def configure_http_tape(self, control: bytes) -> bool:
        self.controls.append(json.loads(control))
        return True

    async def http_journal(self, since: int) -> bytes:
        return self.journal[since:]


class _Runtime:
    def __init__(self, sandbox: _Sandbox, declared: str) -> None:
        from softprobe.gym.shim.protocol import HelloTool

        self.sandbox = sandbox
        self.hello = type("Hello", (), {"tools": [HelloTool(name=declared, builtin=False, description="")]})()


def _exchange(path: str) -> bytes:
    request = canonical_http_request("GET", f"http://site:80{path}", [("Host", "site")], b"")
    return json.dumps({"event": "exchange", "operation": "GET site:80", "digest": canonical_digest(request),
                       "request": request, "response": {"version": "HTTP/1.1", "status": 200, "reason": "OK",
                                                        "headers": [], "body": path, "body_encoding": "utf-8"}
                       }).encode() + b"\n"


async def test_built_in_steps_become_entries_a_declared_tools_do_not(tmp_path):
    from softprobe.gym.actions import ToolAction
    from softprobe.gym.shim.protocol import CallResult
    from softprobe.gym.tapes import TapeFolder, TapeSession
    from softprobe.gym.tapes.http import http_step

    session = TapeSession("record", TapeFolder(tmp_path / "tape"), network_mode="egress")
    sandbox = _Sandbox()
    runtime = _Runtime(sandbox, "site.get")

    async def step(name: str, index: int, journal: bytes) -> CallResult:
        async def run() -> CallResult:
            sandbox.journal += journal  # what the proxy journaled while the call ran
            if name == "shell.exec":
                session.observe_builtin(name, {}, index)  # as the stepper does
            return CallResult(observation="ok", diagnostics={"workspace_digest": "d"})
        return await http_step(session, runtime, ToolAction(name=name, args={}), index, None, "d", run)  # type: ignore[arg-type]

    first = await step("shell.exec", 1, _exchange("/a") + _exchange("/b")[:20])  # the second still being written
    await step("site.get", 2, _exchange("/b")[20:] + _exchange("/c"))  # covered by the tool's own entry
    third = await step("shell.exec", 3, b'{"event": "connect", "operation": "CONNECT site:443", "refused": false}\n')
    assert sandbox.controls == [{"body_cap": 1024 * 1024, "mode": "record"}]  # configured once
    assert first.diagnostics["http_client"] == {"exchange": 1} and third.diagnostics["http_client"] == {"connect": 1}
    entries = TapeFolder(tmp_path / "tape").entries()
    assert [(e.category, e.call_site, e.response.runtime_type) for e in entries] == [
        ("HTTP_CLIENT", "step:1", "application/http+json")]
    report = session.closure_report()
    assert [(d.operation, d.provider) for d in report.dependencies if d.category == "HTTP_CLIENT"] == [
        ("GET site:80", "live"), ("CONNECT site:443", "unsupported")]
    assert not any(d.operation == "network:egress" for d in report.dependencies)  # the precise entries replace it


async def test_a_taped_process_covers_its_http(tmp_path):
    """With ``record_processes`` a ``shell.exec`` is one CHILD_PROCESS entry: the HTTP it sent
    through the proxy is covered by it, never taped a second time as HTTP_CLIENT."""
    from softprobe.gym.actions import ToolAction
    from softprobe.gym.shim.protocol import CallResult
    from softprobe.gym.tapes import TapeFolder, TapeSession
    from softprobe.gym.tapes.http import http_step

    session = TapeSession("record", TapeFolder(tmp_path / "tape"), network_mode="egress", record_processes=True)
    sandbox = _Sandbox()

    async def run() -> CallResult:
        sandbox.journal += _exchange("/a")
        return CallResult(observation="ok", diagnostics={"workspace_digest": "d"})

    call = await http_step(session, _Runtime(sandbox, "site.get"), ToolAction(name="shell.exec", args={}),  # type: ignore[arg-type]
                           1, None, "d", run)
    assert call.error is None and "http_client" not in call.diagnostics
    assert TapeFolder(tmp_path / "tape").entries() == []  # (the stepper's CHILD_PROCESS entry is the only one)


async def test_a_damaged_http_entry_is_a_miss_and_the_steps_go_on(tmp_path):
    """One HTTP_CLIENT entry whose response payload is damaged is left out of what the proxy
    serves (its request then misses), reported ``tape_corrupt``; the other entries are served
    and no step fails for it."""
    from softprobe.gym.actions import ToolAction
    from softprobe.gym.shim.protocol import CallResult
    from softprobe.gym.tapes import TapeFolder, TapeSession
    from softprobe.gym.tapes.http import http_step

    folder = TapeFolder(tmp_path / "tape")
    recording, sandbox = TapeSession("record", folder, network_mode="egress"), _Sandbox()

    async def run_with(journal: bytes) -> CallResult:
        sandbox.journal += journal
        return CallResult(observation="ok", diagnostics={"workspace_digest": "d"})

    await http_step(recording, _Runtime(sandbox, "site.get"), ToolAction(name="shell.exec", args={}),  # type: ignore[arg-type]
                    1, None, "d", lambda: run_with(_exchange("/a") + _exchange("/b")))
    first, second = folder.entries()
    damaged = folder.root / "payloads" / first.response.payload_ref.removeprefix("artifact:").replace(":", "-")
    assert damaged.exists()
    damaged.write_bytes(b"{not json")

    replaying, sandbox = TapeSession("replay", folder, network_mode="egress"), _Sandbox()
    call = await http_step(replaying, _Runtime(sandbox, "site.get"), ToolAction(name="shell.exec", args={}),  # type: ignore[arg-type]
                           1, None, "d", lambda: run_with(b""))
    assert call.error is None and "tape_error" not in call.diagnostics
    (control,) = sandbox.controls
    assert [entry["sequence"] for entry in control["replay"]] == [second.sequence]
    notes = [(d.operation, d.provider, d.note) for d in replaying.closure_report().dependencies
             if d.category == "HTTP_CLIENT"]
    assert notes == [("GET site:80", "unsupported", "tape_corrupt")]
