"""An OpenAI-compatible Chat Completions server on loopback, for tests: it answers
``POST /v1/chat/completions`` with scripted replies in order and records every request.

    with ChatServer([tool_calls(("fs__read", {"path": "a.md"})), final("done")]) as server:
        policy = ChatCompletionsPolicy(base_url=server.base_url, model="test-model")
        ...
        server.requests[0]["tools"]      # what the policy sent

A reply is a chat completion (:func:`tool_calls`, :func:`final`) or a fault (:func:`fault`: a
status, headers and a body). Once the script is spent the server answers 500 with a body
saying so, which a test sees as a failure, never as a silent success.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer: ``status``, ``headers`` and a JSON (or raw text) ``body``."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def completion(message: dict[str, Any], *, prompt_tokens: int = 11, completion_tokens: int = 7,
               model: str = "test-model") -> Reply:
    """A chat completion whose single choice is ``message``."""
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    return Reply(body={
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })


def tool_calls(*calls: tuple[str, Any], content: str | None = None, **usage: int) -> Reply:
    """A reply calling tools: each ``(function name, arguments)``, arguments as a value to encode
    as JSON, or a ``str`` sent as it is (to send malformed arguments)."""
    encoded = [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
        for i, (name, args) in enumerate(calls)
    ]
    return completion({"content": content, "tool_calls": encoded}, **usage)


def final(text: str, **usage: int) -> Reply:
    """A final reply: text, no tool calls."""
    return completion({"content": text}, **usage)


def fault(status: int, body: str = "", *, retry_after: str | None = None) -> Reply:
    """An error response (``Retry-After`` when given)."""
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return Reply(status=status, body={"error": {"message": body or f"scripted {status}", "code": status}},
                 headers=headers)


class ChatServer:
    """The server: ``start()``/``stop()`` or a ``with`` block; ``base_url`` ends in ``/v1``.

    Attributes:
        requests: every request body received, parsed, in order.
        headers: every request's headers (lower-case names), in order.
    """

    def __init__(self, script: Sequence[Reply] = ()) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Headers and body go out as two writes: without this, Nagle's algorithm and the
                # client's delayed ACK add ~40 ms to every reply (not the policy's cost).
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                reply = server._record(self.path, body, {k.lower(): v for k, v in self.headers.items()})
                data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def add(self, *replies: Reply) -> None:
        """Script more replies (after those not yet given)."""
        with self._lock:
            self.script.extend(replies)

    def _record(self, path: str, body: Any, headers: dict[str, str]) -> Reply:
        with self._lock:
            if path != "/v1/chat/completions":
                return Reply(status=404, body={"error": {"message": f"no route {path}"}})
            self.requests.append(body)
            self.headers.append(headers)
            if not self.script:
                return Reply(status=500, body={"error": {"message": "the test server's script is spent"}})
            return self.script.pop(0)

    def start(self) -> ChatServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="chat-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for serve_forever: only if it runs
            self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> ChatServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
