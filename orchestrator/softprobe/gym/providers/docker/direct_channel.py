"""The direct channel: the host talks to the shim over a unix socket of its own, not through
Docker's attach relay (dockerd and containerd-shim copy every byte of attach twice).

The host listens; the shim connects. Before the container is created the host binds a
listening socket in a private folder (mode 0700) and the container gets that one socket file
bind-mounted read-only at ``/run/softprobe-host/shim.sock`` (the folder never crosses, so a
hostile shim reaches nothing of the host's through it). Once the container runs, the host sends
the ``channel`` request over attach with a fresh nonce; the shim connects and sends the nonce
first. The host keeps the connection only if the nonce matches, then closes the listener:
nothing can connect afterwards. The socket file stays, unused, while the container exists
(Docker's archive copies mount every bind source again), and goes with the container (the
container's label :data:`~softprobe.gym.labels.CHANNEL_FOLDER` names its folder); the folder's
name carries its host process's id, so a sweep also removes what a host that died left, even
once its containers are gone.

Attach stays the path (chosen by :func:`direct_channel_problem`, the reason logged) where the
socket cannot cross: Docker Desktop (the engine runs in a VM), remote engines, gVisor (runsc
refuses to mount a host socket), live restores, an engine that refused the mount (the provider
then stays on attach), or when turned off
(``SOFTPROBE_GYM_CHANNEL=attach``, ``DockerProvider(direct_channel=False)``). Attach still
carries the shim's stderr, drained in the background for error messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import shutil
import socket
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from docker.types import Mount

from softprobe.gym import labels as L
from softprobe.gym.errors import SandboxLostError, SandboxStartError
from softprobe.gym.providers.docker.attach_channel import AttachChannel
from softprobe.gym.settings import ContainerSettings
from softprobe.gym.shim.client import RESPONSE_GRACE_S, LineBuffer, ShimClient, ShimRefusedError
from softprobe.gym.shim.protocol import ChannelResult

log = logging.getLogger("softprobe.gym.docker")

#: The name of every channel folder starts so, then its host process's pid and start ticks
#: (the sweep removes only such folders, and only those of processes that are gone).
FOLDER_PREFIX = "softprobe-channel-"
#: Turns the direct channel off for every Docker provider of this process when ``attach``.
CHANNEL_ENV = "SOFTPROBE_GYM_CHANNEL"
#: Where the container sees the host's socket (the shim's ``CHANNEL_PATH``).
CONTAINER_SOCKET = "/run/softprobe-host/shim.sock"
#: How long the shim may take to connect (its own connect timeout is 5 s).
CONNECT_TIMEOUT_S = 5.0
#: How long a closed socket waits for the attach stream's end, so the shim's last stderr
#: lines are in the error message.
STDERR_WAIT_S = 2.0
#: Longest path a unix socket address takes (108 bytes on Linux, with its terminating NUL).
MAX_SOCKET_PATH = 100


def direct_channel_problem(*, info: dict[str, Any], settings: ContainerSettings, engine_url: str,
                           live_restore: bool) -> str | None:
    """Why the shim of a container with ``settings`` cannot be reached directly (attach is
    used instead), or None. ``info``: the engine's ``/info``; ``engine_url``: the address the
    client talks to (docker-py's ``base_url``: ``http+docker://`` for a unix socket)."""
    if not sys.platform.startswith("linux"):
        return "the host is not Linux: its sockets cannot cross into the engine's containers"
    if not engine_url.startswith("http+docker://"):
        return f"the engine at {engine_url} is not a local unix socket: its containers cannot reach this host's sockets"
    if (info.get("OperatingSystem") or "") == "Docker Desktop":
        return "Docker Desktop runs its engine in a VM: this host's sockets cannot cross into it"
    if live_restore:
        return "a live restore's shim resumes on the attach stream it was checkpointed with"
    runtime = settings.runtime or info.get("DefaultRuntime") or "runc"
    registered = (info.get("Runtimes") or {}).get(runtime) or {}
    if Path(str(registered.get("path") or runtime)).name == "runsc":
        return "gVisor (runsc) refuses to mount a host socket into its sandbox"
    return None


def channel_enabled() -> bool:
    """Whether this process's default allows the direct channel (``SOFTPROBE_GYM_CHANNEL``)."""
    return os.environ.get(CHANNEL_ENV, "").strip().lower() != "attach"


class ChannelListener:
    """The host's listening socket for one container, in a private folder of its own.

    Made before the container (its socket file is mounted in); closed once the shim connected
    or the attempt failed; its folder is removed with the container (:func:`remove_folder`).
    """

    def __init__(self) -> None:
        _, pid, ticks = L.current_owner().rsplit(":", 2)
        self.folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{pid}-{ticks}-")  # mode 0700: the host's only
        self.path = os.path.join(self.folder, "shim.sock")
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if len(self.path) > MAX_SOCKET_PATH:
                raise OSError(f"the socket path {self.path} is longer than {MAX_SOCKET_PATH} bytes (set TMPDIR)")
            self._sock.bind(self.path)
            # The container's root has no DAC_OVERRIDE: it may connect only to a socket open to
            # all. The host's folder keeps everyone else on the host out.
            os.chmod(self.path, 0o666)
            self._sock.listen(2)
            self._sock.setblocking(False)
        except BaseException:
            self.close()
            remove_folder(self.folder)
            raise

    def mount(self) -> Mount:
        """The container's read-only bind mount of the socket file (a mount, not a legacy bind:
        a source that is gone fails the start instead of becoming a root-owned folder here)."""
        return Mount(CONTAINER_SOCKET, self.path, type="bind", read_only=True)

    async def accept(self, nonce: str, timeout_s: float) -> socket.socket | None:
        """The connection that sends ``nonce`` first, or None within ``timeout_s``."""
        try:
            return await asyncio.wait_for(self._accept(nonce.encode("ascii")), timeout_s)
        except asyncio.TimeoutError:
            return None

    async def _accept(self, nonce: bytes) -> socket.socket | None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        for _ in range(4):  # only root in the container can connect, and only the shim runs
            conn, _ = await loop.sock_accept(self._sock)
            try:
                if hmac.compare_digest(await _first_line(loop, conn), nonce):
                    return conn
            except OSError:  # a peer that reset the connection: not the shim
                pass
            except BaseException:
                conn.close()
                raise
            conn.close()
        return None

    def close(self) -> None:
        """Stop listening: a connection to the socket is refused from now on."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def sweep_folders() -> list[str]:
    """Remove the channel folders this user's host processes that are gone left in the temp
    folder (blocking); the folders removed."""
    removed = []
    root = tempfile.gettempdir()
    hostname = socket.gethostname()
    for name in os.listdir(root):
        if not name.startswith(FOLDER_PREFIX):
            continue
        pid, _, rest = name[len(FOLDER_PREFIX):].partition("-")
        ticks = rest.partition("-")[0]
        if L.owner_status(f"{hostname}:{pid}:{ticks}") is L.OwnerStatus.GONE:
            folder = os.path.join(root, name)
            if remove_folder(folder):
                removed.append(folder)
    return removed


def remove_folder(folder: str | None) -> bool:
    """Remove a channel folder (blocking): only a folder of this user's named as ours, holding
    at most its socket, so a label cannot make a sweep remove anything else. Whether it did."""
    if not folder or not os.path.basename(folder).startswith(FOLDER_PREFIX):
        return False
    try:
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or set(os.listdir(folder)) - {"shim.sock"}:
            return False
    except OSError:
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not os.path.exists(folder)


class DirectChannel:
    """Implements ``LineChannel`` over the shim's connected socket; the attach stream it came
    from stays open underneath for the shim's stderr (read in the background)."""

    kind = "direct"

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, attach: AttachChannel, *,
                 max_line_bytes: int) -> None:
        self._reader = reader
        self._writer = writer
        self._attach = attach
        self._buffer = LineBuffer(max_line_bytes)
        self._drain = asyncio.ensure_future(self._drain_attach())
        self._closed = False

    async def _drain_attach(self) -> None:
        # Stderr frames are kept by the attach channel; stdout carries nothing once the shim
        # moved to the socket, so any line there is dropped.
        with contextlib.suppress(EOFError, OSError):
            while True:
                await self._attach.recv_line()

    async def send_line(self, line: bytes) -> None:
        self._writer.write(line + b"\n")
        await self._writer.drain()

    async def recv_line(self) -> bytes:
        while (line := self._buffer.take()) is None:
            try:
                chunk = await self._reader.read(1 << 20)
            except ConnectionError:
                chunk = b""
            if not chunk:
                # Not a wait_for: a cancel of the caller meanwhile must reach the caller.
                await asyncio.wait({self._drain}, timeout=STDERR_WAIT_S)
                raise EOFError("the shim's socket closed")
            self._buffer.data += chunk
        return line

    def diagnostics(self) -> str:
        return self._attach.diagnostics()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        self._drain.cancel()
        self._attach.close()


async def upgrade(
    attach: AttachChannel, listener: ChannelListener, *, max_line_bytes: int
) -> AttachChannel | DirectChannel:
    """Ask the shim behind ``attach`` to connect to ``listener``; the direct channel if it did
    (with the right nonce), else ``attach`` as it was. Closes ``listener`` either way (its
    folder stays: see the module's docstring).

    Raises:
        SandboxStartError: the shim did not answer over attach (it is gone).
    """
    nonce = secrets.token_hex(16)
    accepted = asyncio.ensure_future(listener.accept(nonce, CONNECT_TIMEOUT_S + RESPONSE_GRACE_S))
    conn = None
    try:
        try:
            # A client of its own, not closed: closing it would close ``attach``.
            answer = await ShimClient(attach).channel(nonce, timeout_s=CONNECT_TIMEOUT_S + RESPONSE_GRACE_S)
        except ShimRefusedError as err:
            if err.kind != "protocol_error":  # the shim knows the request and failed at it
                raise SandboxStartError(f"the shim could not open the direct channel: {err.detail}") from None
            answer = ChannelResult(connected=False, reason=err.detail)  # an older shim: attach carries on
        except SandboxLostError as err:
            raise SandboxStartError(f"the shim did not start: {err}. The image needs python3 (>= 3.8) on PATH "
                                    "and a /bin/sh.") from None
        if not answer.connected:
            log.info("the shim stays on attach: %s", answer.reason)
            return attach
        conn = await accepted
    finally:
        listener.close()
        if conn is None:
            await _discard(accepted)
    if conn is None:
        log.info("the shim stays on attach: its connection did not bring the nonce in time")
        return attach
    reader, writer = await asyncio.open_unix_connection(sock=conn, limit=1 << 20)
    return DirectChannel(reader, writer, attach, max_line_bytes=max_line_bytes)


async def _discard(accepted: asyncio.Future[socket.socket | None]) -> None:
    """Cancel an accept no one took, and close the connection it may have made already."""
    accepted.cancel()
    await asyncio.wait({accepted})  # raises nothing for the accept; a cancel of the caller goes through
    if not accepted.cancelled() and accepted.exception() is None and (conn := accepted.result()) is not None:
        conn.close()


async def _first_line(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The first line a connection sends (at most 129 bytes), without its newline."""
    data = b""
    while b"\n" not in data and len(data) < 129:
        chunk = await loop.sock_recv(conn, 129 - len(data))
        if not chunk:
            break
        data += chunk
    return data.partition(b"\n")[0]

