"""The direct channel: the host's own unix socket in place of Docker's attach relay.

On a local Linux engine the host binds a listening socket in a private folder of its own and
bind-mounts that one socket file, read-only, at :data:`CHANNEL_PATH`. Asked by the ``channel``
request (over attach, which only the host holds), the shim connects to it and proves itself
with the request's nonce. The host keeps the socket only if the nonce checks out; the shim
follows the host: it moves to the socket once the next request arrives there, and stays on
attach if it arrives on stdin or the socket ends first. Stderr stays on attach either way.

Only root reaches the socket inside the container: :func:`guard_folder` makes its folder
root's, mode 0700, before any tool runs, and the host closes its listener once connected, so
nothing can connect to it afterwards.
"""

from __future__ import annotations

import os
import select
import socket
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CHANNEL_DIR = "/run/softprobe-host"
CHANNEL_PATH = CHANNEL_DIR + "/shim.sock"
CONNECT_TIMEOUT_S = 5.0


def guard_folder() -> str | None:
    """Make the socket's folder root's only (mode 0700); why it cannot be used, or None.

    Called first thing, as PID 1 with no other process in the container: a folder that is not
    a root-owned directory (a link a checkpoint image carried, say) is never used.
    """
    try:
        info = os.lstat(CHANNEL_DIR)
    except OSError:
        return "no channel folder at %s" % CHANNEL_DIR
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
        return "%s is not a directory of root's" % CHANNEL_DIR
    try:
        os.chmod(CHANNEL_DIR, 0o700)
    except OSError as err:
        return "cannot close %s to other users: %s" % (CHANNEL_DIR, err.strerror)
    return None


def connect(nonce: object, folder_problem: str | None) -> tuple[socket.socket | None, str]:
    """Connect to the host's socket and send ``nonce``; (the socket, "") or (None, why not)."""
    if folder_problem is not None:
        return None, folder_problem
    if not isinstance(nonce, str) or not (nonce.isascii() and nonce.isalnum()) or not 16 <= len(nonce) <= 128:
        return None, "the nonce must be 16 to 128 letters or digits"
    try:
        info = os.lstat(CHANNEL_PATH)
    except OSError as err:
        return None, "no socket at %s: %s" % (CHANNEL_PATH, err.strerror)
    if not stat.S_ISSOCK(info.st_mode):
        return None, "%s is not a socket" % CHANNEL_PATH
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec (PEP 446): no tool inherits it
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(CHANNEL_PATH)
        sock.sendall(nonce.encode("ascii") + b"\n")
        sock.settimeout(None)
    except OSError as err:
        sock.close()
        return None, "cannot connect to %s: %s" % (CHANNEL_PATH, err)
    return sock, ""


class SocketStream:
    """The raw-file calls the framing uses (``readinto``, ``write``) over a connected socket;
    a reset reads as the end, as a closed stdin does."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def readinto(self, buffer: Any) -> int:
        try:
            return self.sock.recv_into(buffer)
        except OSError:
            return 0

    def write(self, data: Any) -> int:
        return self.sock.send(data)


def follow(sock: socket.socket, stdin: Any, buffered: bool) -> SocketStream | None:
    """Wait for the host's next bytes: the socket's stream if they come there, else None (the
    socket closed, attach stays). ``buffered``: stdin's reader already holds bytes."""
    if not buffered:
        readable, _, _ = select.select([sock, stdin], [], [])
        if sock in readable:  # else the host wrote to stdin (or closed it): it did not take the socket
            try:
                peeked = sock.recv(1, socket.MSG_PEEK)
            except OSError:
                peeked = b""
            if peeked:
                return SocketStream(sock)
    sock.close()
    return None
