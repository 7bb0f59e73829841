"""Copying workspaces out: extraction refuses anything that would land outside its folder."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from softprobe.gym import UnsafeArchiveError
from softprobe.gym.sandbox.archive import build_seed_archive, safe_extract


def tar_with(*members: tarfile.TarInfo) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for member in members:
            archive.addfile(member, io.BytesIO(b"x" * member.size) if member.isreg() else None)
    buffer.seek(0)
    return buffer


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    "evil",
    [member("../escaped.txt"), member("/tmp/absolute.txt"), member("workspace/../../up.txt")],
    ids=["dotdot", "absolute", "nested-dotdot"],
)
def test_members_whose_names_escape_refuse_the_archive(tmp_path, evil):
    destination = tmp_path / "dest"
    with pytest.raises(UnsafeArchiveError, match="leaves"):
        safe_extract(tar_with(member("workspace/ok.txt"), evil), destination)
    assert [p for p in tmp_path.rglob("*") if destination not in p.parents and p != destination] == []


@pytest.mark.parametrize(
    "evil, reason",
    [
        (member("workspace/link", tarfile.SYMTYPE, "/etc"), "absolute path"),
        (member("workspace/up", tarfile.SYMTYPE, "../../.."), "outside"),
        (member("workspace/hard", tarfile.LNKTYPE, "../outside.txt"), "outside"),
        (member("workspace/dev", tarfile.CHRTYPE), "special file"),
        (member("workspace/fifo", tarfile.FIFOTYPE), "special file"),
    ],
    ids=["symlink-absolute", "symlink-up", "hardlink-out", "device", "fifo"],
)
def test_links_leading_out_and_special_files_are_skipped_and_reported(tmp_path, evil, reason):
    destination = tmp_path / "dest"
    skipped = safe_extract(tar_with(member("workspace/ok.txt"), evil), destination)
    assert [(s.path, reason in s.reason) for s in skipped] == [(evil.name, True)]
    assert (destination / "workspace" / "ok.txt").read_text() == "x"
    assert not os.path.lexists(destination / evil.name)
    assert [p for p in tmp_path.rglob("*") if destination not in p.parents and p != destination] == []


def test_ordinary_members_are_extracted(tmp_path):
    safe_extract(tar_with(member("workspace/a.txt"), member("workspace/l", tarfile.SYMTYPE, "a.txt")), tmp_path)
    assert (tmp_path / "workspace" / "l").read_text() == "x"


def test_seed_archive_owns_the_workspace_for_the_agent_and_keeps_modes(tmp_path):
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o750)
    (tmp_path / "sub").mkdir()
    data = build_seed_archive(tmp_path, uid=1000, gid=1000, extra={"/opt/x/shim.py": b"print()"})
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = {m.name: m for m in archive.getmembers()}
    assert members["workspace"].uid == 1000
    assert members["workspace/run.sh"].mode == 0o750 and members["workspace/run.sh"].uid == 1000
    assert members["workspace/sub"].isdir()
    assert members["opt/x/shim.py"].uid == 0
