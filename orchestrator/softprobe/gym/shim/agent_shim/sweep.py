"""Process control and the end-of-step sweep: nothing a step started outlives it."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time

from .common import SWEEP_DEADLINE_S

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

# ---------------------------------------------------------------------------------------------
# Processes


def _oom_kills() -> int | None:
    """The container cgroup's OOM-kill counter (cgroup v2 or v1), or None if unreadable."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def _other_pids(me: int) -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != me]


#: Set by ``main`` in local mode once the shim is a child subreaper: every process left with no
#: parent below the shim is then handed to it, and its children are all its own commands'.
_local_children_swept = False

#: The episode's declared sessions (``sessions.py``), which the sweep leaves alone: in a
#: container, the marker group of each (a supplementary gid no other process has: it is set by
#: the shim before exec, and an unprivileged process can neither drop nor gain one); in local
#: mode, the id of each session's process session. Changed only by the session manager.
SPARED_GIDS: set[int] = set()
SPARED_SIDS: set[int] = set()


def _proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, session id, state letter) of ``pid`` from /proc; None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()  # the name in parentheses may hold spaces
    try:
        return int(fields[1]), int(fields[3]), group_state(pid, fields[0].decode("ascii", "replace"), int(fields[17]))
    except (IndexError, ValueError):
        return None


def group_state(pid: int, leader: str, threads: int) -> str:
    """The state letter of the whole process ``pid`` (its thread group) given its main thread's.

    A main thread that ended by the raw exit syscall shows ``Z`` while the process's other
    threads run on, so a leader's ``Z`` (or ``T``/``D``) is never taken for the process's: then
    every thread is read. ``Z`` only when every thread has ended, ``T`` when every live one is
    stopped, ``D`` when the others are stopped and these are in the kernel, else a running state.
    Where the threads cannot be listed (gVisor answers EINVAL), a zombie leader with ``threads``
    over one is ``?``: alive, its state unknown (signalled, killed; stopped once sent SIGSTOP).
    """
    if leader not in ("Z", "X", "T", "t", "D") or threads <= 1 and leader in ("Z", "X"):
        return leader
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return "?" if leader in ("Z", "X") else leader
    live = []
    for task in tasks:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, task), "rb") as f:
                data = f.read()
        except OSError:
            continue  # ended meanwhile
        letter = data[data.rfind(b")") + 2 :][:1].decode("ascii", "replace")
        if letter not in ("Z", "X"):
            live.append(letter)
    if not live:
        return "Z"
    moving = [letter for letter in live if letter not in ("T", "t")]
    if not moving:
        return "T"
    return next((letter for letter in moving if letter != "D"), "D")


def _kill_session(sid: int, deadline_s: float = SWEEP_DEADLINE_S) -> bool:
    """Local mode: kill every live process of session ``sid`` (a command started with
    ``start_new_session``); True when none is left.

    Called before the session's leader is reaped: until then no process can get ``sid`` as its
    pid or session, so every process found in the session is one the command started. Each is
    signalled through a pidfd opened and checked first, so a pid reused meanwhile is never hit.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        alive = False
        for pid in _other_pids(os.getpid()):
            info = _proc_stat(pid)
            if info is None or info[1] != sid or info[2] in ("Z", "X"):
                continue
            alive = True
            _kill_if_in_session(pid, sid)
        if not alive:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def _kill_if_in_session(pid: int, sid: int) -> None:
    pidfd = _pidfd(pid)
    if pidfd is None:
        if hasattr(os, "pidfd_open"):
            return  # gone already
        # Python 3.8 has no pidfds: the pid could in principle be reused between the look and the
        # kill; local mode runs on the developer's own (newer) Python.
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        return
    try:
        info = _proc_stat(pid)  # the pidfd pins the process: if it still has the pid, this is it
        if info is not None and info[1] == sid:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass  # exited meanwhile
    finally:
        os.close(pidfd)


def _clear_children(me: int, deadline_s: float) -> bool:
    """Local mode, as a child subreaper: kill and reap every child of the shim (its commands and
    the orphans they left) until it has none; their children become its own in turn."""
    deadline = time.monotonic() + deadline_s
    while True:
        reap_orphans()
        left = False
        for pid in _other_pids(me):
            info = _proc_stat(pid)
            if info is None or info[0] != me or info[1] in SPARED_SIDS:
                continue
            left = True  # a zombie child is reaped on the next round
            if info[2] not in ("Z", "X"):
                # A child's pid cannot be reused before the shim reaps it.
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def clear_processes(deadline_s: float = SWEEP_DEADLINE_S) -> bool:
    """Kill and reap every other process of the container; True when /proc shows only the shim.

    As PID 1, ``kill(-1, SIGKILL)`` reaches every other process of the namespace at once (threads,
    re-forking children, processes whose leader is a zombie), and every orphan becomes our child,
    so repeating kill and reap until /proc lists nobody else terminates quickly. A process that
    still exists at the deadline (an uninterruptible sleep) makes this return False.
    """
    me = os.getpid()
    if me != 1:
        # Not a container's init (local mode, or the shim's classes used in-process as the unit
        # tests do): kill(-1) would reach every process this user may signal on the machine, so
        # touch nobody else. In local mode the shim's own children are its commands' (it is
        # their subreaper); each command's session was killed already (run_process).
        if _local_children_swept:
            return _clear_children(me, deadline_s)
        reap_orphans()
        return True
    if SPARED_GIDS:
        return _clear_all_but(frozenset(SPARED_GIDS), deadline_s)
    if _none_left_as_init():
        return True
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass  # ESRCH: nobody else is left to signal
        reaped = reap_orphans()
        if not _other_pids(me):
            return True
        if time.monotonic() > deadline:
            return False
        if not reaped:
            time.sleep(0.0005)  # SIGKILL is delivered asynchronously; give the kernel a moment


def _proc_groups(pid: int) -> tuple[frozenset[int], str] | None:
    """(supplementary groups, state letter) of ``pid`` from /proc/<pid>/status; None when it is
    gone (or its status cannot be read)."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    groups: frozenset[int] | None = None
    state = "?"
    threads = 1
    for line in data.split(b"\n"):
        if line.startswith(b"Groups:"):
            try:
                groups = frozenset(int(g) for g in line[7:].split())
            except ValueError:
                return None
        elif line.startswith(b"State:"):
            state = line[6:].strip()[:1].decode("ascii", "replace")
        elif line.startswith(b"Threads:"):
            with contextlib.suppress(ValueError):
                threads = int(line[8:])
    return None if groups is None else (groups, group_state(pid, state, threads))


def _signal_pid(pid: int, sig: int, keep: Callable[[frozenset[int]], bool]) -> None:
    """Send ``sig`` to ``pid`` if its groups still satisfy ``keep`` (checked through a pidfd
    that pins the process, where the kernel has pidfds; else by pid: as PID 1 a pid is reused
    only once its holder was reaped, and a wrong guess hits a session's process, never spares
    another one)."""
    pidfd = _pidfd(pid)
    try:
        info = _proc_groups(pid)
        if info is None or not keep(info[0]):
            return
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
    except OSError:
        pass  # exited meanwhile
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _clear_all_but(spared: frozenset[int], deadline_s: float) -> bool:
    """As PID 1 with sessions: kill and reap every process without one of the ``spared``
    groups, until /proc lists only the shim and sessions' processes (True), or the deadline."""
    me = os.getpid()
    deadline = time.monotonic() + deadline_s

    def outside(groups: frozenset[int]) -> bool:
        return not groups & spared

    while True:
        left = False
        for pid in _other_pids(me):
            info = _proc_groups(pid)
            if info is None or not outside(info[0]):
                continue
            left = True  # a zombie counts until it is reaped (its parent is us or dies next)
            if info[1] not in ("Z", "X"):
                _signal_pid(pid, signal.SIGKILL, outside)
        reaped = reap_orphans()
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        if not reaped:
            time.sleep(0.0005)


def signal_groups(gids: frozenset[int], sig: int) -> int:
    """As PID 1: send ``sig`` to every live process holding one of ``gids``; return how many."""
    me = os.getpid()

    def inside(groups: frozenset[int]) -> bool:
        return bool(groups & gids)

    count = 0
    for pid in _other_pids(me):
        info = _proc_groups(pid)
        if info is None or not inside(info[0]) or info[1] in ("Z", "X"):
            continue
        count += 1
        _signal_pid(pid, sig, inside)
    return count


def kill_groups(gids: frozenset[int], deadline_s: float = SWEEP_DEADLINE_S) -> bool:
    """As PID 1: kill and reap every process holding one of ``gids`` (a session closing); True
    when none is left. A stopped process dies of SIGKILL too."""
    deadline = time.monotonic() + deadline_s
    while True:
        alive = signal_groups(gids, signal.SIGKILL)
        reap_orphans()
        if not alive:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def stop_groups(gids: frozenset[int], deadline_s: float = SWEEP_DEADLINE_S) -> list[tuple[int, str]]:
    """As PID 1: stop (SIGSTOP) every process holding one of ``gids`` until each is seen
    stopped, so that none runs while the shim reads the workspace as root; returns those left
    running at the deadline as (pid, state) (none: done). A process forked meanwhile is found
    on the next round (a stopped one cannot fork). A process in the kernel (state D: the parent
    of a vfork, until its child execs, and that child may be stopped first) counts as stopped
    once signalled: the SIGSTOP pending stops it before it runs any code of its own again; so does
    a process whose threads cannot be seen (state ``?``, see :func:`group_state`)."""
    me = os.getpid()
    deadline = time.monotonic() + deadline_s
    signalled: set[int] = set()

    def inside(groups: frozenset[int]) -> bool:
        return bool(groups & gids)

    while True:
        running = []
        for pid in _other_pids(me):
            info = _proc_groups(pid)
            if info is None or not inside(info[0]) or info[1] in ("Z", "X", "T", "t"):
                continue
            if info[1] in ("D", "?") and pid in signalled:
                continue  # in the kernel (or unseen threads): the pending SIGSTOP stops it first
            running.append((pid, info[1]))
            signalled.add(pid)
            _signal_pid(pid, signal.SIGSTOP, inside)
        if not running:
            return []
        if time.monotonic() > deadline:
            return running
        time.sleep(0.0005)
def _none_left_as_init() -> bool:
    """The sweep's fast path, as PID 1: True when no other process exists in the namespace, so
    nothing needs killing, reaping or listing (the step's command ended and left nobody behind).

    ``kill(-1)`` from init signals every other process of the namespace, a double-forked or
    ``setsid`` one included, and the kernel counts an unreaped (zombie) process as a target
    too: only ESRCH, "no process to signal", proves there is none. Anything else (a process
    signalled, EPERM) leaves the full sweep to decide; the SIGKILL sent here is its first round.
    """
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError as err:
        return err.errno == errno.ESRCH
    return False


def reap_orphans() -> int:
    """As PID 1, collect the exit status of orphaned processes (no zombies pile up); return how
    many were collected."""
    reaped = 0
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped += 1


def _become_subreaper() -> None:
    """Local mode: be the child subreaper of the commands, so that their orphans are handed to the
    shim (and swept after the step), not to the machine's init."""
    global _local_children_swept
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _local_children_swept = libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def harden() -> bool:
    """Make this process non-dumpable: its /proc entries (fds included) become root's, so
    processes of the same uid cannot open its pipes or ptrace it. Returns whether it worked."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        done: bool = libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE, 0
        return done
    except (OSError, AttributeError):
        return False


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
