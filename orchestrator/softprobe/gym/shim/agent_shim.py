#!/usr/bin/env python3
"""softprobe-gym agent shim: runs an episode's tools inside its container.

Stdlib only, Python >= 3.8. Started once per episode as the container's main process (under the
container's init) and kept alive. It reads one JSON request per line on stdin and writes one JSON
response per line on stdout; everything else it has to say goes to stderr.

Requests (``id`` is echoed back; ``protocol`` must match on ``hello``):

    {"id": 1, "op": "hello", "protocol": 1}
    {"id": 2, "op": "call", "tool": "fs.read", "args": {...}, "timeout_s": 30, "output_cap": 1048576}
    {"id": 3, "op": "exists", "path": "notes.md"}
    {"id": 4, "op": "read_text", "path": "notes.md", "max_bytes": 1048576}

Responses: ``{"id": N, "ok": true, "result": ...}`` or, when the request itself was unusable,
``{"id": N, "ok": false, "error": {"type": ..., "message": ...}}``. A tool that fails is *not* a
failed request: its result carries ``error`` and an observation that tells the agent the same.

Invariants the host relies on:
- the shim is the container's PID 1 and not dumpable, so tool processes (same uid) can neither
  open its protocol pipes through /proc nor signal it: they cannot forge a response;
- no process started by a tool outlives its step (the shim kills every other process of the
  container but init and itself once a subprocess tool returns), so the workspace cannot change
  between steps and ``workspace_digest`` describes the world the next step starts from;
- file tools never touch anything outside the workspace, after resolving symlinks;
- tool output is capped; the cap keeps the head and the tail around a visible marker.
"""

import hashlib
import json
import os
import selectors
import signal
import stat
import struct
import subprocess
import sys
import time

PROTOCOL_VERSION = 1
SHIM_VERSION = "1.0"
DEFAULT_MANIFEST = "/etc/softprobe/tools.json"
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_OUTPUT_CAP = 1024 * 1024
READ_CHUNK = 65536
# A file modified this close to a scan may change again within the same mtime tick without its
# size changing, so its hash is not cached (git's "racy clean" problem).
RACY_WINDOW_NS = 2_000_000_000


class ToolError(Exception):
    """An agent-facing tool failure: becomes ``result.error``, never a crashed shim."""

    def __init__(self, type_, message, diagnostics=None):
        super().__init__(message)
        self.type = type_
        self.message = message
        self.diagnostics = diagnostics or {}


def printable(raw):
    """A path (bytes) as JSON-safe text: undecodable bytes shown as backslash escapes."""
    return raw.decode("utf-8", "backslashreplace")


# ---------------------------------------------------------------------------------------------
# Workspace digest


class WorkspaceIndex:
    """Content digest of a directory tree, kept as a hash tree so updates cost what changed.

    Two trees have equal digests exactly when they hold the same relative paths with the same
    kinds, permission bits and contents (symlinks: targets). Times and owners do not count.
    Each directory's hash covers its sorted children; a change re-hashes only the directories
    on its path to the root. File hashes are cached by stat signature.
    """

    def __init__(self, root):
        self.root = os.fsencode(root)
        self.entries = {}  # relpath (bytes) -> (kind, mode, content_hash)
        self.signatures = {}  # relpath -> stat signature that content_hash is valid for
        self.children = {b"": set()}  # directory relpath -> names in it
        self._dir_hashes = {}  # directory relpath -> hex digest (cache)

    @property
    def digest(self):
        return "sha256:" + self._dir_hash(b"")

    def scan(self):
        """Walk the whole tree; return the paths that changed since the previous scan."""
        started_ns = time.time_ns()
        entries, signatures, children = {}, {}, {b"": set()}
        stack = [b""]
        while stack:
            rel_dir = stack.pop()
            abs_dir = os.path.join(self.root, rel_dir) if rel_dir else self.root
            try:
                scanner = os.scandir(abs_dir)
            except OSError:
                continue
            with scanner:
                for item in scanner:
                    rel = os.path.join(rel_dir, item.name) if rel_dir else item.name
                    try:
                        st = item.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    entries[rel], sig = self._entry(rel, item.path, st, started_ns)
                    children[rel_dir].add(item.name)
                    if sig is not None:
                        signatures[rel] = sig
                    if stat.S_ISDIR(st.st_mode):
                        children[rel] = set()
                        stack.append(rel)
        old = self.entries
        changed = [rel for rel, entry in entries.items() if old.get(rel) != entry]
        changed.extend(rel for rel in old if rel not in entries)
        self.entries, self.signatures, self.children = entries, signatures, children
        self._dir_hashes = {}
        return sorted(printable(rel) for rel in changed)

    def update_paths(self, rels):
        """Re-read only ``rels`` (and their parents): for when we know exactly what may have changed."""
        started_ns = time.time_ns()
        touched = set()
        for rel in rels:
            parts = rel.split(b"/")
            for i in range(1, len(parts) + 1):
                touched.add(b"/".join(parts[:i]))
        changed = []
        for rel in sorted(touched, key=lambda r: r.count(b"/")):  # parents first
            old = self.entries.get(rel)
            path = os.path.join(self.root, rel)
            try:
                st = os.lstat(path)
            except OSError:
                st = None
            if old is not None and old[0] == "d" and (st is None or not stat.S_ISDIR(st.st_mode)):
                changed.extend(self._drop_subtree(rel))
            if st is None:
                if old is not None:
                    self._forget(rel)
                    changed.append(rel)
                continue
            entry, sig = self._entry(rel, path, st, started_ns)
            self.signatures.pop(rel, None)
            if sig is not None:
                self.signatures[rel] = sig
            if entry != old:
                self.entries[rel] = entry
                parent, _, name = rel.rpartition(b"/")
                self.children.setdefault(parent, set()).add(name)
                self._invalidate(parent)
                changed.append(rel)
            if entry[0] == "d":
                self.children.setdefault(rel, set())
        return sorted(printable(rel) for rel in set(changed))

    def _forget(self, rel):
        self.entries.pop(rel, None)
        self.signatures.pop(rel, None)
        parent, _, name = rel.rpartition(b"/")
        self.children.get(parent, set()).discard(name)
        self._invalidate(parent)

    def _drop_subtree(self, rel):
        """Forget everything below directory ``rel``; return what was there."""
        gone, stack = [], [rel]
        while stack:
            directory = stack.pop()
            for name in self.children.pop(directory, set()):
                child = directory + b"/" + name if directory else name
                if self.entries.get(child, ("",))[0] == "d":
                    stack.append(child)
                self.entries.pop(child, None)
                self.signatures.pop(child, None)
                gone.append(child)
            self._dir_hashes.pop(directory, None)
        return gone

    def _invalidate(self, directory):
        while True:
            self._dir_hashes.pop(directory, None)
            if not directory:
                return
            directory = directory.rpartition(b"/")[0]

    def _dir_hash(self, rel):
        """The hash of directory ``rel``, computed bottom-up without recursion (trees can be deep)."""
        pending = [rel]
        while pending:
            directory = pending[-1]
            if directory in self._dir_hashes:
                pending.pop()
                continue
            names = sorted(self.children.get(directory, ()))
            missing = []
            for name in names:
                child = directory + b"/" + name if directory else name
                if self.entries[child][0] == "d" and child not in self._dir_hashes:
                    missing.append(child)
            if missing:
                pending.extend(missing)
                continue
            h = hashlib.sha256()
            for name in names:
                child = directory + b"/" + name if directory else name
                kind, mode, content = self.entries[child]
                if kind == "d":
                    content = self._dir_hashes[child]
                h.update(b"%s\0%s\0%o\0%s\n" % (name, kind.encode(), mode, content.encode()))
            self._dir_hashes[directory] = h.hexdigest()
            pending.pop()
        return self._dir_hashes[rel]

    def _entry(self, rel, path, st, started_ns):
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            try:
                return ("l", 0, hashlib.sha256(os.readlink(path)).hexdigest()), None
            except OSError:
                return ("l", 0, ""), None
        if stat.S_ISDIR(st.st_mode):
            return ("d", mode, ""), None
        if not stat.S_ISREG(st.st_mode):
            return ("o", mode, ""), None
        sig = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        if self.signatures.get(rel) == sig:
            content = self.entries[rel][2]
        else:
            content = _hash_file(path)
        racy = max(st.st_mtime_ns, st.st_ctime_ns) >= started_ns - RACY_WINDOW_NS
        return ("f", mode, content), (None if racy else sig)


class ChangeTracker:
    """Which workspace paths changed since the last look, from inotify (Linux), so that a step in
    a large workspace costs in proportion to what it changed, not to the workspace's size.

    ``changes()`` returns a set of relative paths (bytes), or None when it cannot say (no
    inotify, out of watches, a queue overflow, a directory renamed): then the caller rescans.
    inotify does not see writes through ``mmap``; run with ``--digest scan`` where that matters.
    """

    IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
    IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
    IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x400, 0x800, 0x4000, 0x8000, 0x40000000
    IN_DONT_FOLLOW, IN_NONBLOCK, IN_CLOEXEC = 0x2000000, 0x800, 0x80000
    MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
            | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_DONT_FOLLOW)

    def __init__(self, root):
        self.root = os.fsencode(root)
        self.fd = None
        self.watches = {}  # wd -> relative directory path (bytes)
        try:
            import ctypes

            self.libc = ctypes.CDLL(None, use_errno=True)
            fd = self.libc.inotify_init1(self.IN_NONBLOCK | self.IN_CLOEXEC)
            if fd >= 0:
                self.fd = fd
        except (OSError, AttributeError):
            self.fd = None

    @property
    def usable(self):
        return self.fd is not None

    def watch_all(self, directories):
        """Watch the root and ``directories`` (relative); False if the kernel refuses one."""
        self.watches.clear()
        return all(self._watch(rel) for rel in [b""] + sorted(directories))

    def _watch(self, rel):
        path = os.path.join(self.root, rel) if rel else self.root
        wd = self.libc.inotify_add_watch(self.fd, path, self.MASK)
        if wd < 0:
            return False
        self.watches[wd] = rel
        return True

    def changes(self):
        changed, exact = set(), True
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            offset = 0
            while offset + 16 <= len(data):
                wd, mask, _cookie, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16 : offset + 16 + length].rstrip(b"\0")
                offset += 16 + length
                if mask & self.IN_Q_OVERFLOW:
                    exact = False
                    continue
                if mask & self.IN_IGNORED:
                    self.watches.pop(wd, None)
                    continue
                directory = self.watches.get(wd)
                if directory is None:
                    continue
                rel = os.path.join(directory, name) if directory and name else (name or directory)
                if mask & self.IN_ISDIR and mask & (self.IN_MOVED_FROM | self.IN_MOVED_TO):
                    exact = False  # a renamed directory moves watches: start over
                if mask & self.IN_ISDIR and mask & self.IN_CREATE:
                    # Whatever appeared inside before we watch it is found by walking it.
                    for sub in _walk_dirs(self.root, rel):
                        if not self._watch(sub):
                            exact = False
                    changed.update(_walk_all(self.root, rel))
                if rel:
                    changed.add(rel)
        return changed if exact else None


def _walk_dirs(root, rel):
    out = [rel]
    for dirpath, dirnames, _files in os.walk(os.path.join(root, rel)):
        base = os.path.relpath(dirpath, root)
        out.extend(os.path.join(base, d) for d in dirnames)
    return out


def _walk_all(root, rel):
    out = [rel]
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, rel)):
        base = os.path.relpath(dirpath, root)
        out.extend(os.path.join(base, n) for n in dirnames + filenames)
    return out


def _hash_file(path):
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                h.update(chunk)
    except OSError as err:
        # Unreadable files still count, as unreadable.
        return "unreadable:%s" % err.errno
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Output capture


class CappedOutput:
    """Keeps the first and last ``cap // 2`` bytes of a stream, counting what was dropped."""

    def __init__(self, cap):
        self.cap = max(int(cap), 64)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data):
        self.total += len(data)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            keep = self.cap - self.cap // 2
            if len(self.tail) > 2 * keep:
                del self.tail[: len(self.tail) - keep]

    @property
    def truncated(self):
        return self.total > self.cap

    def text(self):
        if not self.truncated:
            return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace")
        keep = self.cap - self.cap // 2
        tail = bytes(self.tail[-keep:])
        dropped = self.total - len(self.head) - len(tail)
        marker = "\n[... softprobe-gym: %d bytes of output truncated ...]\n" % dropped
        return bytes(self.head).decode("utf-8", "replace") + marker + tail.decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# Processes


def _oom_kills():
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


def kill_strays():
    """SIGKILL every process in the container but init and the shim; return how many still live."""
    me, uid = os.getpid(), os.getuid()
    alive = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in (1, me):
            continue
        try:
            if os.stat("/proc/%d" % pid).st_uid != uid and uid != 0:
                continue
            with open("/proc/%d/stat" % pid, "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue  # already dead, waiting to be reaped
            os.kill(pid, signal.SIGKILL)
            alive += 1
        except (OSError, IndexError):
            pass
    return alive


def clear_processes(timeout_s=5.0):
    """Kill every other process and reap it: when this returns, only the shim (and init) remain.

    SIGKILL takes effect asynchronously and a process may fork between two sweeps (a fork bomb),
    so sweep, kill and reap until nothing is left, for at most ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        alive = kill_strays()
        reap_orphans()
        if alive == 0 or time.monotonic() > deadline:
            return
        time.sleep(0.001)


def run_process(argv, cwd, timeout_s, output_cap, stdin_data=b""):
    """Run ``argv`` in its own process group; return (exit_code, CappedOutput, diagnostics).

    Raises ToolError("timeout") when the deadline passes and ToolError("out_of_memory") when the
    kernel's OOM killer ended it. Every process the command started is dead when this returns.
    """
    oom_before = _oom_kills()
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin_data else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as err:
        raise ToolError("command_failed", "could not start %s: %s" % (argv[0], err.strerror))
    if stdin_data:
        try:
            proc.stdin.write(stdin_data)
        except OSError:
            pass
        proc.stdin.close()
    output = CappedOutput(output_cap)
    deadline = started + timeout_s
    timed_out = False
    fd = proc.stdout.fileno()
    # A pidfd wakes us the moment the command exits even if a background child it started still
    # holds the pipe open (no EOF then); without one (Python < 3.9) we poll.
    pidfd = _pidfd(proc.pid)
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ, "output")
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        exited = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            events = sel.select(remaining if pidfd is not None else min(remaining, 0.05))
            if any(key.data == "output" for key, _ in events):
                chunk = os.read(fd, READ_CHUNK)
                if not chunk:
                    break
                output.add(chunk)
            elif exited or proc.poll() is not None:
                # The command has exited; take what is already in the pipe, then stop.
                if not exited and pidfd is not None:
                    sel.unregister(pidfd)
                exited = True
                if not sel.select(0):
                    break
    if pidfd is not None:
        os.close(pidfd)
    _kill_group(proc.pid)
    proc.stdout.close()
    exit_code = proc.wait()
    clear_processes()
    diagnostics = {
        "exit_code": exit_code,
        "command_ms": round((time.monotonic() - started) * 1000, 3),
        "output_bytes": output.total,
        "output_truncated": output.truncated,
    }
    if timed_out or exit_code != 0:
        diagnostics["output"] = output.text()  # what it printed before it failed
    if timed_out:
        raise ToolError(
            "timeout",
            "command did not finish within %gs; it and every process it started were killed"
            % timeout_s,
            diagnostics,
        )
    # The OOM killer's counter, not the exit code, decides: a shell reports its killed child as
    # 137, a program may catch the failure and exit 1, and SIGKILL alone can be anyone's doing.
    oom_after = _oom_kills()
    if exit_code != 0 and oom_before is not None and oom_after is not None and oom_after > oom_before:
        raise ToolError(
            "out_of_memory",
            "a process of the command was killed by the out-of-memory killer (the container's "
            "memory limit was reached)",
            diagnostics,
        )
    if exit_code in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        raise ToolError(
            "file_too_large",
            "a process of the command tried to write a file larger than the container's limit "
            "(max_file_size) and was stopped",
            diagnostics,
        )
    if exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL) and oom_before is None:
        diagnostics["note"] = "killed by SIGKILL; possibly out of memory (cgroup counters unreadable)"
    return exit_code, output, diagnostics


def reap_orphans():
    """As PID 1, collect the exit status of orphaned processes (no zombies pile up)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def harden():
    """Make this process non-dumpable: its /proc entries (fds included) become root's, so
    processes of the same uid cannot open its pipes or ptrace it. Returns whether it worked."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        return False


def _pidfd(pid):
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------
# Tools


class Shim:
    def __init__(self, workspace, manifest_path, digest_mode="inotify"):
        self.hardened = False
        self.workspace = os.path.realpath(workspace)
        self.index = WorkspaceIndex(self.workspace)
        self.tracker = ChangeTracker(self.workspace) if digest_mode == "inotify" else None
        self.full_scan()
        self.declared = load_manifest(manifest_path)
        self.builtins = {
            "fs.read": self.fs_read,
            "fs.write": self.fs_write,
            "fs.list": self.fs_list,
            "fs.delete": self.fs_delete,
            "shell.exec": self.shell_exec,
        }

    # -- protocol ------------------------------------------------------------------------------

    def handle(self, request):
        op = request.get("op")
        if op == "hello":
            if request.get("protocol") != PROTOCOL_VERSION:
                raise ProtocolError(
                    "host speaks protocol %r, this shim speaks %d"
                    % (request.get("protocol"), PROTOCOL_VERSION)
                )
            return self.hello()
        if op == "call":
            return self.call(request)
        if op == "exists":
            return self._exists(request)
        if op == "read_text":
            return self._read_text(request)
        if op == "rescan":
            self.full_scan()
            return {"workspace_digest": self.index.digest}
        if op == "seed":
            return self.seed(request)
        raise ProtocolError("unknown op %r" % (op,))

    def full_scan(self):
        """Rescan the whole workspace (and re-arm change tracking); return what changed."""
        changed = self.index.scan()
        if self.tracker is not None and self.tracker.usable:
            directories = [rel for rel, entry in self.index.entries.items() if entry[0] == "d"]
            if not self.tracker.watch_all(directories):
                self.tracker = None  # out of inotify watches: full scans from now on
            else:
                self.tracker.changes()  # drop events from before the scan
        return changed

    def refresh(self, touched=None):
        """Bring the digest up to date after a tool ran; return the changed paths.

        ``touched`` lists what a file tool changed itself; None means a process ran, so anything
        may have changed: ask the tracker, or rescan.
        """
        tracked = self.tracker.changes() if self.tracker is not None and self.tracker.usable else None
        if touched is None and tracked is None:
            return self.full_scan()
        paths = set(touched or ()) | set(tracked or ())
        return self.index.update_paths(sorted(paths)) if paths else []

    def hello(self):
        tools = [{"name": name, "builtin": True} for name in self.builtins]
        tools += [
            {"name": name, "builtin": False, "description": spec.get("description", "")}
            for name, spec in sorted(self.declared.items())
        ]
        return {
            "protocol": PROTOCOL_VERSION,
            "shim_version": SHIM_VERSION,
            "python": "%d.%d.%d" % sys.version_info[:3],
            "uid": os.getuid(),
            "workspace": self.workspace,
            "tools": tools,
            "workspace_digest": self.index.digest,
            "workspace_files": sorted(printable(p) for p, e in self.index.entries.items() if e[0] == "f"),
            "digest_mode": "inotify" if self.tracker is not None and self.tracker.usable else "scan",
            "pid": os.getpid(),
            "hardened": self.hardened,
        }

    def call(self, request):
        started = time.monotonic()
        name = request.get("tool")
        args = request.get("args")
        timeout_s = float(request.get("timeout_s") or DEFAULT_TIMEOUT_S)
        output_cap = int(request.get("output_cap") or DEFAULT_OUTPUT_CAP)
        diagnostics = {}
        error = None
        try:
            if not isinstance(args, dict):
                raise ToolError("invalid_arguments", "args must be a JSON object")
            if name in self.builtins:
                observation, diagnostics, touched = self.builtins[name](args, timeout_s, output_cap)
            elif name in self.declared:
                observation, diagnostics = self.run_declared(name, args, timeout_s, output_cap)
                touched = None
            else:
                known = ", ".join(sorted(list(self.builtins) + list(self.declared)))
                raise ToolError("unknown_tool", "no tool named %r; available: %s" % (name, known))
        except ToolError as err:
            error = {"type": err.type, "message": err.message}
            diagnostics = dict(err.diagnostics)
            observation = "error (%s): %s" % (err.type, err.message)
            # A failed subprocess may have written files before it failed.
            touched = None if name == "shell.exec" or name in self.declared else []
        except Exception as err:  # a bug or an input no check foresaw: still an answer, not a crash
            error = {"type": "internal_error", "message": "%s: %s" % (type(err).__name__, err)}
            diagnostics = {}
            observation = "error (internal_error): %s" % error["message"]
            touched = None
        diagnostics["changed_paths"] = self.refresh(touched)
        diagnostics["workspace_digest"] = self.index.digest
        diagnostics["tool_ms"] = round((time.monotonic() - started) * 1000, 3)
        return {"observation": observation, "error": error, "diagnostics": diagnostics}

    # -- paths ---------------------------------------------------------------------------------

    def resolve(self, path, must_exist=False):
        """Map an agent path to an absolute path inside the workspace, or raise ToolError."""
        if not isinstance(path, str) or path == "":
            raise ToolError("invalid_arguments", "path must be a non-empty string")
        if "\x00" in path:
            raise ToolError("invalid_arguments", "path must not contain NUL bytes")
        if os.path.isabs(path):
            raise ToolError(
                "path_outside_workspace",
                "absolute paths are not allowed; use a path relative to the workspace",
            )
        joined = os.path.join(self.workspace, path)
        real = os.path.realpath(joined)
        if real != self.workspace and not real.startswith(self.workspace + os.sep):
            raise ToolError(
                "path_outside_workspace",
                "%r resolves outside the workspace; file tools only reach the workspace" % path,
            )
        if must_exist and not os.path.lexists(real):
            raise ToolError("not_found", "%r does not exist" % path)
        return real

    def relative(self, real):
        return os.fsencode(os.path.relpath(real, self.workspace))

    # -- built-in tools ------------------------------------------------------------------------

    def fs_read(self, args, timeout_s, output_cap):
        _check_args(args, required={"path": str})
        real = self.resolve(args["path"], must_exist=True)
        if os.path.isdir(real):
            raise ToolError("is_a_directory", "%r is a directory; use fs.list" % args["path"])
        if not os.path.isfile(real):
            # A FIFO or device would block or never end.
            raise ToolError("not_a_regular_file", "%r is not a regular file" % args["path"])
        output = CappedOutput(output_cap)
        try:
            with open(real, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                keep = output.cap // 2
                if size > output.cap:
                    # Only the head and the tail are kept: read just those, not gigabytes between.
                    output.add(f.read(keep))
                    f.seek(size - keep)
                    output.add(f.read(keep))
                    output.total = size
                else:
                    output.add(f.read(output.cap + 1))
        except OSError as err:
            raise ToolError(_os_error_type(err), "cannot read %r: %s" % (args["path"], err.strerror))
        diagnostics = {"bytes": output.total, "output_truncated": output.truncated}
        return output.text(), diagnostics, []

    def fs_write(self, args, timeout_s, output_cap):
        _check_args(args, required={"path": str}, optional={"content": str})
        content = args.get("content", "")
        real = self.resolve(args["path"])
        if os.path.isdir(real):
            raise ToolError("is_a_directory", "%r is a directory" % args["path"])
        data = content.encode("utf-8", "surrogateescape")
        try:
            os.makedirs(os.path.dirname(real), exist_ok=True)
            fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except OSError as err:
            raise ToolError(_os_error_type(err), "cannot write %r: %s" % (args["path"], err.strerror))
        return "wrote %d bytes to %s" % (len(data), args["path"]), {"bytes": len(data)}, [self.relative(real)]

    def fs_list(self, args, timeout_s, output_cap):
        _check_args(args, optional={"path": str})
        path = args.get("path", ".")
        real = self.resolve(path, must_exist=True)
        if not os.path.isdir(real):
            raise ToolError("not_a_directory", "%r is not a directory" % path)
        entries = []
        try:
            with os.scandir(real) as it:
                for item in it:
                    st = item.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        kind = "dir"
                    elif stat.S_ISLNK(st.st_mode):
                        kind = "symlink"
                    elif stat.S_ISREG(st.st_mode):
                        kind = "file"
                    else:
                        kind = "other"
                    entries.append({"name": item.name, "type": kind, "size": st.st_size})
        except OSError as err:
            raise ToolError(_os_error_type(err), "cannot list %r: %s" % (path, err.strerror))
        entries.sort(key=lambda e: e["name"])
        return entries, {"entries": len(entries)}, []

    def fs_delete(self, args, timeout_s, output_cap):
        _check_args(args, required={"path": str})
        path = args["path"]
        # Deleting a symlink removes the link itself: resolve the parent, keep the last name.
        lexical = os.path.normpath(os.path.join(self.workspace, path))
        parent = self.resolve(os.path.relpath(os.path.dirname(lexical), self.workspace))
        target = os.path.join(parent, os.path.basename(lexical))
        if target == self.workspace or os.path.isabs(path):
            raise ToolError("path_outside_workspace", "cannot delete %r: not inside the workspace" % path)
        if not os.path.lexists(target):
            raise ToolError("not_found", "%r does not exist" % path)
        try:
            if os.path.isdir(target) and not os.path.islink(target):
                _rmtree(target)
            else:
                os.unlink(target)
        except OSError as err:
            raise ToolError(_os_error_type(err), "cannot delete %r: %s" % (path, err.strerror))
        return "deleted %s" % path, {}, [self.relative(target)]

    def shell_exec(self, args, timeout_s, output_cap):
        _check_args(args, required={"command": str}, optional={"timeout_s": (int, float)})
        if "timeout_s" in args:
            if args["timeout_s"] <= 0:
                raise ToolError("invalid_arguments", "timeout_s must be positive")
            timeout_s = min(float(args["timeout_s"]), timeout_s)
        if "\x00" in args["command"]:
            raise ToolError("invalid_arguments", "command must not contain NUL bytes")
        argv = ["/bin/sh", "-c", args["command"]]
        exit_code, output, diagnostics = run_process(argv, self.workspace, timeout_s, output_cap)
        text = output.text()
        if exit_code != 0:
            raise ToolError(
                "command_failed",
                "exit code %d%s" % (exit_code, (": " + _last_line(text)) if text else ""),
                diagnostics,
            )
        return text, diagnostics, None

    # -- declared tools ------------------------------------------------------------------------

    def run_declared(self, name, args, timeout_s, output_cap):
        spec = self.declared[name]
        _check_schema(args, spec.get("args", {}))
        timeout_s = min(float(spec.get("timeout_s", timeout_s)), timeout_s)
        stdin_data = json.dumps(args).encode()
        exit_code, output, diagnostics = run_process(
            list(spec["command"]), self.workspace, timeout_s, output_cap, stdin_data
        )
        text = output.text()
        if exit_code != 0:
            raise ToolError(
                "tool_failed",
                "%s exited with code %d%s" % (name, exit_code, (": " + _last_line(text)) if text else ""),
                diagnostics,
            )
        if spec.get("output", "text") == "json" and not output.truncated:
            try:
                return json.loads(text), diagnostics
            except ValueError:
                raise ToolError("tool_failed", "%s printed invalid JSON" % name, diagnostics)
        return text, diagnostics

    # -- seeding -----------------------------------------------------------------------------

    def seed(self, request):
        """Extract a base64 tar of seed files into the workspace (as the agent user)."""
        import base64
        import io
        import tarfile

        data = base64.b64decode(request.get("archive") or "")
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            for member in archive.getmembers():
                name = os.path.normpath(member.name)
                if name.startswith(("/", "..")) or not (member.isfile() or member.isdir() or member.issym()):
                    raise ProtocolError("seed archive member %r is not allowed" % member.name)
                target = os.path.join(self.workspace, name)
                if member.isdir():
                    os.makedirs(target, exist_ok=True)
                    os.chmod(target, member.mode & 0o7777)
                elif member.issym():
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    os.symlink(member.linkname, target)
                else:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    with open(target, "wb") as out:
                        out.write(archive.extractfile(member).read())
                    os.chmod(target, member.mode & 0o7777)
        self.full_scan()
        return self.hello()

    # -- host helpers (on_step) ----------------------------------------------------------------

    def _exists(self, request):
        try:
            return os.path.lexists(self.resolve(request.get("path")))
        except ToolError:
            return False

    def _read_text(self, request):
        real = self.resolve(request.get("path"), must_exist=True)
        limit = int(request.get("max_bytes") or DEFAULT_OUTPUT_CAP)
        with open(real, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")


class ProtocolError(Exception):
    """The request itself was unusable (not a tool failure)."""


def load_manifest(path):
    """Read the image's tool manifest; a broken manifest is reported on stderr and ignored."""
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        sys.stderr.write("softprobe shim: ignoring unreadable manifest %s: %s\n" % (path, err))
        return {}
    tools = {}
    for name, spec in (manifest.get("tools") or {}).items():
        command = spec.get("command") if isinstance(spec, dict) else None
        if not (isinstance(command, list) and command and all(isinstance(c, str) for c in command)):
            sys.stderr.write("softprobe shim: tool %r needs a non-empty command list\n" % name)
            continue
        tools[name] = spec
    return tools


_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
}


def _check_schema(args, schema):
    """A small JSON-Schema subset for declared tools: required, properties.type, additionalProperties."""
    props = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in args:
            raise ToolError("invalid_arguments", "missing required argument %r" % key)
    for key, value in args.items():
        if key not in props:
            if schema.get("additionalProperties", True) is False:
                raise ToolError("invalid_arguments", "unexpected argument %r" % key)
            continue
        want = props[key].get("type")
        if want in _JSON_TYPES and not _is_type(value, _JSON_TYPES[want]):
            raise ToolError("invalid_arguments", "argument %r must be of type %s" % (key, want))


def _check_args(args, required=None, optional=None):
    required = required or {}
    optional = optional or {}
    for key, kind in required.items():
        if key not in args:
            raise ToolError("invalid_arguments", "missing required argument %r" % key)
    for key, value in args.items():
        kind = required.get(key) or optional.get(key)
        if kind is None:
            allowed = ", ".join(sorted(list(required) + list(optional))) or "none"
            raise ToolError("invalid_arguments", "unexpected argument %r (allowed: %s)" % (key, allowed))
        if not _is_type(value, kind):
            raise ToolError("invalid_arguments", "argument %r has the wrong type" % key)


def _is_type(value, kind):
    # bool is an int in Python but not in JSON.
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, kind)


def _os_error_type(err):
    import errno

    return {
        errno.ENOENT: "not_found",
        errno.EACCES: "permission_denied",
        errno.EPERM: "permission_denied",
        errno.EISDIR: "is_a_directory",
        errno.ENOTDIR: "not_a_directory",
        errno.ELOOP: "path_outside_workspace",
        errno.ENOSPC: "no_space",
        errno.EFBIG: "file_too_large",
        errno.EDQUOT: "no_space",
        errno.EROFS: "permission_denied",
    }.get(err.errno, "io_error")


def _rmtree(path):
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
        for name in dirs:
            full = os.path.join(root, name)
            if os.path.islink(full):
                os.unlink(full)
            else:
                os.rmdir(full)
    os.rmdir(path)


def _last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


# ---------------------------------------------------------------------------------------------
# Main loop


def main(argv):
    workspace = "/workspace"
    manifest = DEFAULT_MANIFEST
    digest_mode = "inotify"
    it = iter(argv)
    for arg in it:
        if arg == "--workspace":
            workspace = next(it)
        elif arg == "--manifest":
            manifest = next(it)
        elif arg == "--digest":
            digest_mode = next(it)
    # Tools must not inherit the protocol streams.
    stdin = os.fdopen(os.dup(0), "rb", buffering=0)
    stdout = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    hardened = harden()
    shim = Shim(workspace, manifest, digest_mode)
    shim.hardened = hardened
    reader = _LineReader(stdin)
    while True:
        line = reader.readline()
        if line is None:
            return 0
        request_id = None
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ProtocolError("a request must be a JSON object")
            request_id = request.get("id")
            response = {"id": request_id, "ok": True, "result": shim.handle(request)}
        except (ValueError, ProtocolError) as err:
            response = {"id": request_id, "ok": False, "error": {"type": "protocol_error", "message": str(err)}}
        except ToolError as err:
            response = {"id": request_id, "ok": False, "error": {"type": err.type, "message": err.message}}
        except Exception as err:  # never die on a request: report it and go on
            response = {
                "id": request_id,
                "ok": False,
                "error": {"type": "shim_error", "message": "%s: %s" % (type(err).__name__, err)},
            }
        data = json.dumps(response, ensure_ascii=False, separators=(",", ":"))
        stdout.write(data.encode("utf-8", "backslashreplace") + b"\n")


class _LineReader:
    """Line reader over a raw fd (readline on an unbuffered file reads byte by byte)."""

    def __init__(self, raw):
        self.raw = raw
        self.buffer = bytearray()
        self.scanned = 0  # bytes of buffer known to hold no newline: long lines stay linear

    def readline(self):
        while True:
            newline = self.buffer.find(b"\n", self.scanned)
            if newline >= 0:
                line = bytes(self.buffer[:newline])
                del self.buffer[: newline + 1]
                self.scanned = 0
                return line
            self.scanned = len(self.buffer)
            chunk = self.raw.read(1 << 20)
            if not chunk:
                return None
            self.buffer += chunk


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
