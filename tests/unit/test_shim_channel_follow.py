"""The shim's side of the direct channel without a container: it follows the host to the
socket only when the host's next request arrives there, and never takes a bad nonce."""

from __future__ import annotations

import os
import socket

from softprobe.gym.shim.agent_shim.channel import SocketStream, connect, follow


def _stdin() -> tuple[object, int]:
    read, write = os.pipe()
    return os.fdopen(read, "rb", buffering=0), write


def test_the_shim_moves_to_the_socket_when_the_next_request_comes_there():
    shim_side, host_side = socket.socketpair()
    stdin, stdin_writer = _stdin()
    host_side.sendall(b'{"id": 1, "op": "hello"}\n')
    stream = follow(shim_side, stdin, buffered=False)
    assert isinstance(stream, SocketStream)
    buffer = bytearray(64)
    assert stream.readinto(buffer) == 25  # nothing was consumed by the peek
    stream.write(b"reply\n")
    assert host_side.recv(16) == b"reply\n"
    for end in (shim_side, host_side, stdin):
        end.close()  # type: ignore[attr-defined]
    os.close(stdin_writer)


def test_the_shim_stays_on_attach_when_the_host_writes_there_or_hangs_up():
    for host_takes in ("stdin", "hang up", "buffered"):
        shim_side, host_side = socket.socketpair()
        stdin, stdin_writer = _stdin()
        if host_takes == "stdin":
            os.write(stdin_writer, b'{"id": 1}\n')
        elif host_takes == "hang up":
            host_side.close()
        assert follow(shim_side, stdin, buffered=host_takes == "buffered") is None, host_takes
        assert shim_side.fileno() == -1  # closed: the shim keeps no second way in
        stdin.close()  # type: ignore[attr-defined]
        os.close(stdin_writer)
        host_side.close()


def test_a_bad_nonce_or_no_folder_never_connects():
    for nonce in (None, "short", "é" * 32, "a" * 200, "a b" * 10):
        sock, reason = connect(nonce, None)
        assert sock is None and "nonce" in reason
    sock, reason = connect("a" * 32, "no channel folder at /run/softprobe-host")
    assert sock is None and reason.startswith("no channel folder")
