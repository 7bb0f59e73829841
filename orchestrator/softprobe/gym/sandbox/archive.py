"""Tar archives in and out of containers: seed files in, workspaces out, extracted safely."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ..errors import UnsafeArchiveError

_HAS_FILTERS = hasattr(tarfile, "data_filter")


def build_seed_archive(
    seed_root: Path | None, *, uid: int, gid: int, extra: dict[str, bytes] | None = None
) -> bytes:
    """A tar to extract at ``/``: ``workspace/`` owned by ``uid:gid`` with the seed files in it.

    Regular files, directories and symlinks are copied with their permission bits; other file
    types are skipped. ``extra`` maps absolute container paths to root-owned files (the shim).
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(_dir_member("workspace", 0o755, uid, gid))
        if seed_root is not None:
            for path in sorted(_walk(seed_root)):
                rel = path.relative_to(seed_root).as_posix()
                member = archive.gettarinfo(str(path), arcname=f"workspace/{rel}")
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


def safe_extract(stream: BinaryIO, destination: Path) -> None:
    """Extract a tar stream into ``destination``, refusing anything that would escape it.

    Uses the standard library's ``data`` filter (PEP 706) where Python has it and an equivalent
    check otherwise: no absolute names, no ``..``, no links leading out, no device files.

    Raises:
        UnsafeArchiveError: a member would land outside ``destination``.
    """
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            if _HAS_FILTERS:
                try:
                    checked = tarfile.data_filter(member, str(destination))
                except tarfile.FilterError as err:
                    raise UnsafeArchiveError(
                        f"refused archive member {member.name!r}: {err}; nothing outside "
                        f"{destination} was written"
                    ) from None
                archive.extract(checked, str(destination), filter="fully_trusted")
            else:  # Python < 3.10.12 / 3.11.4
                archive.extract(_fallback_filter(member, destination), str(destination))


def _fallback_filter(member: tarfile.TarInfo, destination: Path) -> tarfile.TarInfo:
    root = os.path.realpath(destination)
    target = os.path.realpath(os.path.join(root, member.name))
    if member.name.startswith("/") or os.path.commonpath([root, target]) != root:
        raise UnsafeArchiveError(f"refused archive member {member.name!r}: outside {destination}")
    if member.isdev():
        raise UnsafeArchiveError(f"refused archive member {member.name!r}: device file")
    if member.issym() or member.islnk():
        base = os.path.dirname(target) if member.issym() else root
        link = os.path.realpath(os.path.join(base, member.linkname))
        if member.linkname.startswith("/") or os.path.commonpath([root, link]) != root:
            raise UnsafeArchiveError(f"refused archive member {member.name!r}: link leads outside")
    member.mode &= 0o755
    return member
