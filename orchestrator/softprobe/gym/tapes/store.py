"""A tape folder on disk: ``tape.jsonl`` (one :class:`TapeEntry` a line) and
``payloads/sha256-<hex>`` (each payload once, named by the sha256 of its bytes), and the
sidecar ``workspace-effects.jsonl`` (which entries' calls changed the workspace; absent if none).

Crash safety: a payload is written to a temporary file, fsynced and renamed before the entry that
references it is appended; an entry line is appended and fsynced as one write. A crash can
therefore leave at most a torn *last* line, which :func:`read_entries` ignores: the tape stays
valid up to its last full entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from softprobe.gym.errors import TapeError
from softprobe.gym.tapes.canonical import sha256_digest
from softprobe.gym.tapes.model import TapeEntry

TAPE_FILE = "tape.jsonl"
PAYLOADS = "payloads"
#: Sidecar: which entries' calls changed the workspace (``{"sequence", "changed_paths"}`` a line).
EFFECTS_FILE = "workspace-effects.jsonl"


def payload_ref(data: bytes) -> str:
    """``artifact:sha256:<hex>`` of ``data``."""
    return "artifact:" + sha256_digest(data)


class TapeFolder:
    """Reads and writes one tape folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def tape_path(self) -> Path:
        """``tape.jsonl``."""
        return self.root / TAPE_FILE

    def exists(self) -> bool:
        """Whether the folder holds a ``tape.jsonl``."""
        return self.tape_path.is_file()

    def start(self) -> None:
        """Begin an empty tape (a record attempt): the folder made, ``tape.jsonl`` emptied.
        Payloads already there stay (they are content-addressed)."""
        try:
            (self.root / PAYLOADS).mkdir(parents=True, exist_ok=True)
            (self.root / EFFECTS_FILE).unlink(missing_ok=True)
            with open(self.tape_path, "wb") as handle:
                os.fsync(handle.fileno())
        except OSError as err:
            raise TapeError(f"cannot start a tape in {self.root}: {err.strerror}") from None

    def put_payload(self, data: bytes) -> str:
        """Store ``data`` once (atomically, fsynced); its ``artifact:sha256:`` reference.

        Raises:
            TapeError: the payload cannot be written (no space, no permission, folder gone).
        """
        ref = payload_ref(data)
        path = self.payload_path(ref)
        if path.exists():
            return ref
        try:
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".payload-")
        except OSError as err:
            raise TapeError(f"cannot store a payload in {self.root}: {err.strerror}") from None
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException as err:
            Path(temp).unlink(missing_ok=True)
            if isinstance(err, OSError):
                raise TapeError(f"cannot store a payload in {self.root}: {err.strerror}") from None
            raise
        return ref

    def payload_path(self, ref: str) -> Path:
        """Where the payload ``ref`` lives (``payloads/sha256-<hex>``)."""
        hexdigest = ref.removeprefix("artifact:").removeprefix("sha256:")
        if len(hexdigest) != 64 or any(c not in "0123456789abcdef" for c in hexdigest):
            raise TapeError(f"{ref!r} is not an artifact:sha256: payload reference")
        return self.root / PAYLOADS / f"sha256-{hexdigest}"

    def get_payload(self, ref: str) -> bytes:
        """The bytes of payload ``ref``, checked against its digest.

        Raises:
            TapeError: it is missing or its bytes do not match its digest.
        """
        path = self.payload_path(ref)
        try:
            data = path.read_bytes()
        except OSError as err:
            raise TapeError(f"tape {self.root}: payload {ref} cannot be read: {err.strerror}") from None
        if payload_ref(data) != ref:
            raise TapeError(f"tape {self.root}: payload {path.name} does not match its digest (it was altered)")
        return data

    def append(self, entry: TapeEntry) -> None:
        """Append ``entry`` as one line and fsync it (its payloads must be stored already)."""
        line = entry.model_dump_json().encode("utf-8") + b"\n"
        try:
            with open(self.tape_path, "ab") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as err:
            raise TapeError(f"cannot append to {self.tape_path}: {err.strerror}") from None

    def note_effects(self, sequence: int, changed_paths: int, **more: str) -> None:
        """Note in ``workspace-effects.jsonl`` that entry ``sequence``'s call changed
        ``changed_paths`` workspace paths, with ``more`` string fields (a change set's
        reference, or why there is none: :mod:`softprobe.gym.tapes.changes`). Fsynced.

        Raises:
            TapeError: the file cannot be appended to.
        """
        record = {"sequence": sequence, "changed_paths": changed_paths, **more}
        line = json.dumps(record).encode("utf-8") + b"\n"
        try:
            with open(self.root / EFFECTS_FILE, "ab") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as err:
            raise TapeError(f"cannot append to {self.root / EFFECTS_FILE}: {err.strerror}") from None

    def effect_lines(self) -> dict[int, dict[str, Any]]:
        """``{sequence: line}`` of ``workspace-effects.jsonl`` (none when it is absent): the
        lines of entries whose call changed the workspace (``changed_paths`` > 0). A line that is
        not a complete record (a crash mid-write) is ignored.

        Raises:
            TapeError: the file exists but cannot be read.
        """
        path = self.root / EFFECTS_FILE
        if not path.is_file():
            return {}
        try:
            lines = path.read_bytes().split(b"\n")
        except OSError as err:
            raise TapeError(f"cannot read {path}: {err.strerror}") from None
        found: dict[int, dict[str, Any]] = {}
        for line in lines:
            try:
                record = json.loads(line)
                sequence, count = record["sequence"], record["changed_paths"]
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(sequence, int) and isinstance(count, int) and count > 0:
                found[sequence] = record
        return found

    def effects(self) -> dict[int, int]:
        """``{sequence: changed paths}`` of :meth:`effect_lines`.

        Raises:
            TapeError: the file exists but cannot be read.
        """
        return {sequence: line["changed_paths"] for sequence, line in self.effect_lines().items()}

    def entries(self) -> list[TapeEntry]:
        """See :func:`read_entries`."""
        return read_entries(self.tape_path)

    def verify(self) -> list[str]:
        """Problems found: every payload file's bytes against its name, every entry's payloads
        and every change set ``workspace-effects.jsonl`` references present. Empty when the
        tape is sound.

        Raises:
            TapeError: ``tape.jsonl`` or ``workspace-effects.jsonl`` cannot be read.
        """
        problems: list[str] = []
        folder = self.root / PAYLOADS
        for path in sorted(folder.glob("sha256-*")) if folder.is_dir() else []:
            actual = hashlib.sha256(path.read_bytes()).hexdigest()
            if path.name != f"sha256-{actual}":
                problems.append(f"payload {path.name} has digest sha256:{actual}")
        for entry in self.entries():
            for ref in (entry.request.payload_ref, entry.response.payload_ref):
                if not self.payload_path(ref).is_file():
                    problems.append(f"entry {entry.sequence} references a missing payload {ref}")
        for sequence, line in self.effect_lines().items():
            change_ref = line.get("changes_ref")
            if change_ref is None:
                continue
            try:
                present = isinstance(change_ref, str) and self.payload_path(change_ref).is_file()
            except TapeError:
                present = False
            if not present:
                problems.append(f"entry {sequence}'s change set {change_ref!r} is missing (workspace-effects.jsonl)")
        return problems


def read_entries(path: Path) -> list[TapeEntry]:
    """The entries of ``tape.jsonl``, in order. Text after the last newline (a line torn by a
    crash mid-write) is ignored; a complete line that is not an entry is an error.

    Raises:
        TapeError: the file cannot be read, a line before the last is malformed, or the
            sequence numbers are not 0, 1, 2, ...
    """
    try:
        data = path.read_bytes()
    except OSError as err:
        raise TapeError(f"cannot read the tape {path}: {err.strerror}") from None
    lines = data.split(b"\n")
    complete = lines[:-1]  # what follows the last newline is empty, or a torn line: ignored
    entries: list[TapeEntry] = []
    for number, line in enumerate(complete, 1):
        try:
            entry = TapeEntry.model_validate(json.loads(line))
        except (ValueError, ValidationError) as err:
            raise TapeError(f"{path} line {number} is not a tape entry: {str(err).splitlines()[0]}") from None
        if entry.sequence != len(entries):
            raise TapeError(f"{path} line {number} has sequence {entry.sequence}, expected {len(entries)}")
        entries.append(entry)
    return entries


__all__ = ["EFFECTS_FILE", "PAYLOADS", "TAPE_FILE", "TapeFolder", "payload_ref", "read_entries"]
