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
    """Content digest of a directory tree, cached by stat signature so repeat scans are cheap.

    Two trees have equal digests exactly when they hold the same relative paths with the same
    kinds, permission bits and contents (symlinks: targets). Times and owners do not count.
    """

    def __init__(self, root):
        self.root = os.fsencode(root)
        self.entries = {}  # relpath (bytes) -> (kind, mode, content_hash)
        self.signatures = {}  # relpath -> stat signature that content_hash is valid for
        self.digest = None

    def scan(self):
        """Walk the whole tree; return the paths that changed since the previous scan."""
        started_ns = time.time_ns()
        entries = {}
        signatures = {}
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
                    if sig is not None:
                        signatures[rel] = sig
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(rel)
        changed = self._diff(entries)
        self.entries, self.signatures = entries, signatures
        self.digest = self._hash(entries)
        return changed

    def update_paths(self, rels):
        """Re-read only ``rels`` (and their parents): for tools that know exactly what they touched."""
        started_ns = time.time_ns()
        touched = set()
        for rel in rels:
            parts = rel.split(b"/")
            for i in range(1, len(parts) + 1):
                touched.add(b"/".join(parts[:i]))
        entries = dict(self.entries)
        signatures = dict(self.signatures)
        for rel in sorted(touched):
            path = os.path.join(self.root, rel)
            try:
                st = os.lstat(path)
            except OSError:
                st = None
            if st is None or not stat.S_ISDIR(st.st_mode):
                # Whatever was a directory here is gone, and its subtree with it.
                prefix = rel + b"/"
                for gone in [p for p in entries if p.startswith(prefix)]:
                    entries.pop(gone, None)
                    signatures.pop(gone, None)
            if st is None:
                entries.pop(rel, None)
                signatures.pop(rel, None)
                continue
            entries[rel], sig = self._entry(rel, path, st, started_ns)
            signatures.pop(rel, None)
            if sig is not None:
                signatures[rel] = sig
        changed = self._diff(entries)
        self.entries, self.signatures = entries, signatures
        self.digest = self._hash(entries)
        return changed

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

    def _diff(self, entries):
        old = self.entries
        changed = [rel for rel, entry in entries.items() if old.get(rel) != entry]
        changed.extend(rel for rel in old if rel not in entries)
        return sorted(printable(rel) for rel in changed)

    @staticmethod
    def _hash(entries):
        h = hashlib.sha256()
        for rel in sorted(entries):
            kind, mode, content = entries[rel]
            h.update(b"%s\0%s\0%o\0%s\n" % (rel, kind.encode(), mode, content.encode()))
        return "sha256:" + h.hexdigest()


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
    """SIGKILL every process in the container except init and the shim itself."""
    me, uid = os.getpid(), os.getuid()
    killed = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in (1, me):
            continue
        try:
            if os.stat("/proc/%d" % pid).st_uid != uid and uid != 0:
                continue
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:
            pass
    return killed


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
    kill_strays()
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
    def __init__(self, workspace, manifest_path):
        self.workspace = os.path.realpath(workspace)
        self.index = WorkspaceIndex(self.workspace)
        self.index.scan()
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
            self.index.scan()
            return {"workspace_digest": self.index.digest}
        raise ProtocolError("unknown op %r" % (op,))

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
        if touched is None:
            changed = self.index.scan()
        elif touched:
            changed = self.index.update_paths(touched)
        else:
            changed = []
        diagnostics["changed_paths"] = changed
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
    it = iter(argv)
    for arg in it:
        if arg == "--workspace":
            workspace = next(it)
        elif arg == "--manifest":
            manifest = next(it)
    # Tools must not inherit the protocol streams.
    stdin = os.fdopen(os.dup(0), "rb", buffering=0)
    stdout = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    shim = Shim(workspace, manifest)
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
