"""Tar archives in and out of containers: seed files in, workspaces out, extracted safely."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ..errors import UnsafeArchiveError
from ..results import SkippedMember

_HAS_FILTERS = hasattr(tarfile, "data_filter")


def build_seed_archive(
    seed_root: Path | None,
    *,
    uid: int,
    gid: int,
    extra: dict[str, bytes] | None = None,
    workspace: bool = True,
    prefix: str = "workspace/",
) -> bytes:
    """A tar to extract at ``/``: ``workspace/`` owned by ``uid:gid`` with the seed files in it.

    Regular files, directories and symlinks are copied with their permission bits; other file
    types are skipped. ``extra`` maps absolute container paths to root-owned files (the shim).
    ``workspace=False`` leaves out the ``workspace/`` entry; ``prefix=""`` makes member names
    relative to the workspace (for the shim's ``seed`` op).
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        if workspace:
            archive.addfile(_dir_member("workspace", 0o755, uid, gid))
        if seed_root is not None:
            for path in sorted(_walk(seed_root)):
                rel = path.relative_to(seed_root).as_posix()
                member = archive.gettarinfo(str(path), arcname=f"{prefix}{rel}")
                member.uid, member.gid, member.uname, member.gname = uid, gid, "", ""
                if member.isreg():
                    with open(path, "rb") as f:
                        archive.addfile(member, f)
                elif member.isdir() or member.issym():
                    archive.addfile(member)
        for target, data in (extra or {}).items():
            parts = PurePosixPath(target.lstrip("/"))
            for parent in reversed(parts.parents[:-1]):
                archive.addfile(_dir_member(str(parent), 0o755, 0, 0))
            member = tarfile.TarInfo(str(parts))
            member.size, member.mode = len(data), 0o644
            archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def _walk(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
                found.append(path)
    return found


def _dir_member(name: str, mode: int, uid: int, gid: int) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.mode, member.uid, member.gid = tarfile.DIRTYPE, mode, uid, gid
    return member


def safe_extract(stream: BinaryIO, destination: Path) -> list[SkippedMember]:
    """Extract a tar stream into ``destination``; nothing may land outside it.

    Uses the standard library's ``data`` filter (PEP 706) where Python has it and an equivalent
    check otherwise. A member whose *name* escapes (absolute, ``..``) refuses the whole archive.
    Members that are fine inside a workspace but unsafe to recreate on the host (a symlink to
    ``/etc/passwd``, a FIFO) are skipped and returned, so the rest of the workspace is kept.

    Raises:
        UnsafeArchiveError: a member's name would land outside ``destination``.
    """
    destination.mkdir(parents=True, exist_ok=True)
    skipped: list[SkippedMember] = []
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            if member.name.startswith("/") or ".." in PurePosixPath(member.name).parts:
                raise UnsafeArchiveError(
                    f"refused archive member {member.name!r}: its path leaves {destination}; "
                    "nothing outside it was written"
                )
            reason = _skip_reason(member, destination)
            if reason is not None:
                skipped.append(SkippedMember(path=member.name, reason=reason))
                continue
            if _HAS_FILTERS:
                try:
                    checked = tarfile.data_filter(member, str(destination))
                except tarfile.FilterError as err:
                    raise UnsafeArchiveError(f"refused archive member {member.name!r}: {err}") from None
                archive.extract(checked, str(destination), filter="fully_trusted")
            else:  # Python < 3.10.12 / 3.11.4: the same rules, checked above, plus the mode mask
                member.mode &= 0o755
                archive.extract(member, str(destination))
    return skipped


def _skip_reason(member: tarfile.TarInfo, destination: Path) -> str | None:
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return "special file (device or FIFO)"
    if member.issym() or member.islnk():
        if member.linkname.startswith("/"):
            return f"link to the absolute path {member.linkname!r}"
        root = os.path.realpath(destination)
        base = os.path.dirname(os.path.join(root, member.name)) if member.issym() else root
        target = os.path.realpath(os.path.join(base, member.linkname))
        if os.path.commonpath([root, target]) != root:
            return f"link leading outside the folder ({member.linkname!r})"
    return None
