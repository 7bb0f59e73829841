"""The direct channel's host side without a container: when attach is kept, the listener's
nonce check, which folders are removed, the fallback to attach, and the socket channel's end."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from softprobe.gym.errors import SandboxStartError
from softprobe.gym.providers.docker.direct_channel import (
    ChannelListener,
    DirectChannel,
    direct_channel_problem,
    remove_folder,
    sweep_folders,
    upgrade,
)
from softprobe.gym.settings import ContainerSettings
from softprobe.gym.shim.client import LineBuffer

LINUX = {"OperatingSystem": "Debian GNU/Linux 12", "DefaultRuntime": "runc",
         "Runtimes": {"runc": {"path": "runc"}, "runsc": {"path": "/usr/bin/runsc"}, "gvisor": {"path": "/opt/runsc"}}}


def problem(info: dict = LINUX, *, runtime: str | None = None, url: str = "http+docker://localhost",
            **extra: object) -> str | None:
    options = {"info": info, "settings": ContainerSettings(runtime=runtime), "engine_url": url,
               "live_restore": False, **extra}
    return direct_channel_problem(**options)  # type: ignore[arg-type]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the direct channel is for Linux hosts only")
def test_a_local_linux_engine_under_runc_takes_the_direct_channel():
    assert problem() is None


@pytest.mark.parametrize(("case", "reason"), [
    ({"url": "https://10.0.0.2:2376"}, "not a local unix socket"),
    ({"url": "http://builder:2375"}, "not a local unix socket"),
    ({"info": {**LINUX, "OperatingSystem": "Docker Desktop"}}, "Docker Desktop"),
    ({"live_restore": True}, "live restore"),
    ({"runtime": "runsc"}, "gVisor"),
    ({"runtime": "gvisor"}, "gVisor"),  # registered under another name: known by its program
    ({"info": {**LINUX, "DefaultRuntime": "runsc"}}, "gVisor"),  # the engine's default
])
def test_attach_is_kept_where_the_socket_cannot_cross(case, reason):
    assert reason in (problem(**case) or "")


async def _connect(path: str, first: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, path)
    await asyncio.get_running_loop().sock_sendall(sock, first)
    return sock


async def test_the_listener_keeps_only_the_connection_with_the_nonce():
    listener = ChannelListener()
    assert os.stat(listener.folder).st_mode & 0o777 == 0o700
    nonce = "ab" * 16
    try:
        accepted = asyncio.ensure_future(listener.accept(nonce, 5))
        impostor = await _connect(listener.path, b"0" * 32 + b"\n")
        shim = await _connect(listener.path, nonce.encode() + b"\n")
        conn = await accepted
        assert conn is not None
        conn.sendall(b"hello\n")
        assert shim.recv(16) == b"hello\n"
        assert impostor.recv(16) == b""  # the impostor was hung up on
        for sock in (conn, shim, impostor):
            sock.close()
    finally:
        listener.close()
    # Closed, it refuses connections; its folder stays (the container's mount source) until removed.
    with socket.socket(socket.AF_UNIX) as late, pytest.raises(ConnectionRefusedError):
        late.connect(listener.path)
    remove_folder(listener.folder)
    assert not os.path.exists(listener.folder)


def test_only_a_channel_folder_of_ours_holding_its_socket_is_removed(tmp_path):
    named = tmp_path / "softprobe-channel-x"
    named.mkdir()
    (named / "shim.sock").write_text("")
    other = tmp_path / "not-ours"
    other.mkdir()
    crowded = tmp_path / "softprobe-channel-crowded"
    crowded.mkdir()
    (crowded / "precious.txt").write_text("keep")
    for folder in (other, crowded, tmp_path / "softprobe-channel-missing", None):
        remove_folder(None if folder is None else str(folder))
    assert other.exists() and (crowded / "precious.txt").exists()
    remove_folder(str(named))
    assert not named.exists()


async def test_the_listener_gives_up_in_time_on_a_silent_peer():
    listener = ChannelListener()
    try:
        silent = await _connect(listener.path, b"")
        assert await listener.accept("cd" * 16, 0.2) is None
        silent.close()
    finally:
        listener.close()


class RefusingAttach:
    """An attach channel whose shim does not know the ``channel`` request (an older shim)."""

    kind = "attach"

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def send_line(self, line: bytes) -> None:
        self.sent.append(json.loads(line))

    async def recv_line(self) -> bytes:
        request_id = self.sent[-1]["id"]
        return json.dumps({"id": request_id, "ok": False,
                           "error": {"type": "protocol_error", "message": "unknown op 'channel'"}}).encode()

    def diagnostics(self) -> str:
        return ""

    def close(self) -> None:
        raise AssertionError("the attach channel must stay open")


async def test_a_shim_without_the_request_stays_on_attach_and_the_listener_closes():
    attach, listener = RefusingAttach(), ChannelListener()
    kept = await upgrade(attach, listener, max_line_bytes=1024)  # type: ignore[arg-type]
    assert kept is attach
    assert attach.sent[0]["op"] == "channel" and len(attach.sent[0]["nonce"]) == 32
    with socket.socket(socket.AF_UNIX) as late, pytest.raises(ConnectionRefusedError):
        late.connect(listener.path)  # the listener closed
    remove_folder(listener.folder)


class FailingAttach(RefusingAttach):
    """A shim that knows the request and fails at it (not an older shim)."""

    async def recv_line(self) -> bytes:
        return json.dumps({"id": self.sent[-1]["id"], "ok": False,
                           "error": {"type": "shim_error", "message": "UnicodeEncodeError: ..."}}).encode()


async def test_a_shim_that_fails_at_the_request_is_a_start_error_not_a_silent_fallback():
    listener = ChannelListener()
    with pytest.raises(SandboxStartError, match="could not open the direct channel"):
        await upgrade(FailingAttach(), listener, max_line_bytes=1024)  # type: ignore[arg-type]
    remove_folder(listener.folder)


class CountingBytes(bytearray):
    """A buffer that counts the bytes its newline searches go through."""

    searched = 0

    def find(self, sub, start=0, *rest):  # type: ignore[no-untyped-def,override]
        CountingBytes.searched += len(self) - start
        return super().find(sub, start, *rest)


def test_a_line_that_never_ends_is_searched_once_per_byte():
    buffer = LineBuffer(max_line_bytes=1 << 20)
    buffer.data = CountingBytes()
    fed = 0
    with pytest.raises(EOFError, match="exceeded"):
        while True:
            assert buffer.take() is None
            buffer.data += b"x" * 4096
            fed += 4096
    assert CountingBytes.searched <= fed  # quadratic before: each chunk searched all that came before


class EndedAttach(RefusingAttach):
    """The attach stream of a shim that ended: its stderr tail, then the end."""

    closed = False

    async def recv_line(self) -> bytes:
        raise EOFError("the container's output stream ended")

    def diagnostics(self) -> str:
        return "softprobe shim: giving up: last words"

    def close(self) -> None:
        self.closed = True


async def test_the_direct_channel_reads_lines_bounds_them_and_ends_with_eof():
    ours, theirs = socket.socketpair()
    attach = EndedAttach()
    channel = DirectChannel(*await asyncio.open_unix_connection(sock=ours), attach,  # type: ignore[arg-type]
                            max_line_bytes=64)
    theirs.sendall(b'{"a": 1}\n{"b"')
    assert await channel.recv_line() == b'{"a": 1}'
    theirs.sendall(b': 2}\n')
    assert await channel.recv_line() == b'{"b": 2}'
    await channel.send_line(b"request")
    assert theirs.recv(16) == b"request\n"
    theirs.close()
    with pytest.raises(EOFError, match="socket closed"):
        await channel.recv_line()
    assert "last words" in channel.diagnostics()
    channel.close()
    assert attach.closed


async def test_a_line_over_the_bound_ends_the_direct_channel():
    ours, theirs = socket.socketpair()
    channel = DirectChannel(*await asyncio.open_unix_connection(sock=ours), EndedAttach(),  # type: ignore[arg-type]
                            max_line_bytes=64)
    theirs.sendall(b"x" * 100)
    with pytest.raises(EOFError, match="exceeded 64 bytes"):
        await channel.recv_line()
    channel.close()
    theirs.close()


@pytest.fixture
def short_tmp(monkeypatch) -> Iterator[Path]:
    """A temp folder of its own, short enough for a socket's path (pytest's tmp_path is not)."""
    folder = Path(tempfile.mkdtemp(prefix="sp-"))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    yield folder
    shutil.rmtree(folder)


def test_a_sweep_removes_the_folders_of_hosts_that_are_gone_and_keeps_the_living(short_tmp):
    tmp_path = short_tmp
    listener = ChannelListener()  # this process's: alive
    listener.close()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f"softprobe-channel-{ended.stdout.strip()}-1-abc"
    gone.mkdir(mode=0o700)
    (gone / "shim.sock").write_text("")
    reused = tmp_path / f"softprobe-channel-{os.getpid()}-1-def"  # our pid, another start: a reused pid
    reused.mkdir(mode=0o700)
    unrelated = tmp_path / "softprobe-channel-notapid"
    unrelated.mkdir()
    (unrelated / "data").write_text("keep")  # not only a socket: never removed
    assert sorted(sweep_folders()) == sorted([str(gone), str(reused)])
    assert os.path.isdir(listener.folder) and unrelated.exists()
    assert os.path.basename(listener.folder).startswith(f"softprobe-channel-{os.getpid()}-")
    remove_folder(listener.folder)
