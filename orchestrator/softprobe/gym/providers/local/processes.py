"""The processes a local sandbox's shim started, found and ended without touching any other.

Commands run in sessions of their own, so a process group does not hold them; the shim is a
child subreaper in local mode, so everything they leave behind stays below it. Removal therefore
kills the shim's whole process tree, through pidfds, re-checking each process's parent first so
that a reused pid is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal

#: Rounds of "list the tree, kill it" before giving up (a fork bomb outpacing us).
MAX_ROUNDS = 50


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process visible in /proc."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 2 and fields[0] != b"Z":
            parents[int(name)] = int(fields[1])
    return parents


def descendants(root: int, parents: dict[int, int] | None = None) -> list[int]:
    """Every live process below ``root`` (not ``root`` itself)."""
    parents = _parents() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def kill_tree(root: int) -> int:
    """SIGKILL every process below ``root`` until none is left; return how many were killed.

    Each is signalled through a pidfd opened after it was listed and confirmed (again) to be
    below ``root``, so a pid that was reused in between is left alone.
    """
    killed = 0
    for _ in range(MAX_ROUNDS):
        pids = descendants(root)
        if not pids:
            break
        handles: dict[int, int] = {}
        for pid in pids:
            with contextlib.suppress(OSError):  # gone already
                handles[pid] = os.pidfd_open(pid)
        try:
            confirmed = set(descendants(root))  # after the pidfds: a reused pid is not below root
            for pid, fd in handles.items():
                if pid in confirmed:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                        killed += 1
        finally:
            for fd in handles.values():
                os.close(fd)
    return killed


__all__ = ["descendants", "kill_tree"]
