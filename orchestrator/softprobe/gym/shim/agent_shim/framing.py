"""The framing of the protocol: one JSON request per line (raw content after it when it
says ``raw``), one JSON response per line, written whole."""

from __future__ import annotations

import json

from .common import ShimBroken

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn, Protocol

    class RawStream(Protocol):
        """What the framing reads and writes: stdin/stdout's raw files, or the host's socket."""

        def readinto(self, buffer: Any, /) -> int | None: ...

        def write(self, data: Any, /) -> int | None: ...


def _readable(value: object) -> object:
    """``value`` with every string made valid text (lone surrogates become backslash escapes)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            try:
                return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:
                return value.encode("utf-8", "backslashreplace").decode("ascii")
    if isinstance(value, dict):
        return {_readable(k): _readable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_readable(v) for v in value]
    return value


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError("%s is not valid JSON" % name)


#: The most raw content one request may carry (a seed's tar, a chunk of staged blobs).
MAX_RAW_BYTES = 1 << 30

#: Made once: ``json.loads``/``json.dumps`` with options build a new decoder/encoder per call.
_REQUEST_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
_RESPONSE_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _write_all(raw: RawStream, data: bytes) -> None:
    """Write every byte: a raw write may take only part of it (gVisor's pipes do, past 64 KiB)."""
    view = memoryview(data)
    while view:
        written = raw.write(view)
        view = view[written or 0:]


class _LineReader:
    """Line reader over a raw fd (readline on an unbuffered file reads byte by byte)."""

    def __init__(self, raw: RawStream) -> None:
        self.raw = raw
        self.buffer = bytearray()
        self.scanned = 0  # bytes of buffer known to hold no newline: long lines stay linear
        # Read into one fixed buffer: a fresh 1 MiB bytes object per read costs an mmap and an
        # munmap for every request.
        self.chunk = bytearray(1 << 20)
        self.view = memoryview(self.chunk)

    def read_exact(self, n: int) -> bytes | None:
        """The next ``n`` bytes and the newline after them (raw content); None at the end."""
        while len(self.buffer) < n + 1:
            got = self.raw.readinto(self.view)
            if not got:
                return None
            self.buffer += self.view[:got]
        if self.buffer[n] != 0x0A:
            raise ShimBroken("raw content of %d bytes is not followed by a newline" % n)
        with memoryview(self.buffer) as view:  # one copy (a slice of the buffer would be two)
            data = view[:n].tobytes()
        del self.buffer[: n + 1]
        self.scanned = 0
        return data

    def readline(self) -> bytes | None:
        while True:
            newline = self.buffer.find(b"\n", self.scanned)
            if newline >= 0:
                line = bytes(self.buffer[:newline])
                del self.buffer[: newline + 1]
                self.scanned = 0
                return line
            self.scanned = len(self.buffer)
            got = self.raw.readinto(self.view)
            if not got:
                return None
            self.buffer += self.view[:got]
