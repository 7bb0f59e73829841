"""Copying workspaces out: extraction refuses anything that would land outside its folder."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile

import pytest

from softprobe.gym import UnsafeArchiveError
from softprobe.gym.providers.archive import build_seed_archive, safe_extract


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


def dir_member(name: str, mode: int = 0o755) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    return info


def data_member(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def tar_of(*entries: tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape") as archive:
        for entry in entries:
            info, data = entry if isinstance(entry, tuple) else (entry, b"")
            archive.addfile(info, io.BytesIO(data) if info.isreg() else None)
    buffer.seek(0)
    return buffer


def escapes(root) -> list[str]:  # type: ignore[no-untyped-def]
    """Links under ``root`` that resolve outside it."""
    real_root = os.path.realpath(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            resolved = os.path.realpath(path)
            if os.path.islink(path) and resolved != real_root and not resolved.startswith(real_root + "/"):
                out.append(path)
    return out


def test_a_link_chain_whose_meaning_changes_later_in_the_archive_is_not_recreated(tmp_path):
    # Each link looks harmless when it arrives: "b" -> "z/m/n" while z does not exist yet, so
    # "c" -> "b/../../../.." climbs only to the destination. Then "z" -> "." shortens b by one
    # level, and c now reaches the destination's parent.
    archive = tar_of(
        dir_member("workspace"),
        member("workspace/b", tarfile.SYMTYPE, "z/m/n"),
        member("workspace/c", tarfile.SYMTYPE, "b/../../../.."),
        dir_member("workspace/m"),
        dir_member("workspace/m/n"),
        member("workspace/z", tarfile.SYMTYPE, "."),
    )
    destination = tmp_path / "dest"
    skipped = safe_extract(archive, destination)
    assert escapes(destination / "workspace") == []
    assert [s.path for s in skipped] == ["workspace/c"]
    assert "outside" in skipped[0].reason
    assert os.readlink(destination / "workspace" / "b") == "z/m/n"  # the harmless ones stay


def test_folders_and_files_keep_their_permission_bits_but_not_setuid(tmp_path):
    safe_extract(
        tar_of(dir_member("workspace", 0o755), dir_member("workspace/private", 0o700),
               dir_member("workspace/locked", 0o500), data_member("workspace/locked/in.txt", b"x", 0o400),
               data_member("workspace/run", b"#!/bin/sh\n", 0o4751), data_member("workspace/none", b"", 0o000)),
        tmp_path,
    )
    modes = {p: stat.S_IMODE(os.lstat(tmp_path / "workspace" / p).st_mode) for p in ["private", "locked", "locked/in.txt", "run", "none"]}
    assert modes == {"private": 0o700, "locked": 0o500, "locked/in.txt": 0o400, "run": 0o751, "none": 0o000}


def test_files_are_written_sparse_and_whole(tmp_path):
    size = 64 * 1024 * 1024
    data = bytearray(size)
    data[-1:] = b"!"
    data[1000:1005] = b"hello"
    safe_extract(tar_of(dir_member("workspace"), data_member("workspace/sparse", bytes(data))), tmp_path)
    written = tmp_path / "workspace" / "sparse"
    assert written.stat().st_size == size
    assert written.stat().st_blocks * 512 < 1024 * 1024  # two blocks of data, not 64 MiB
    with open(written, "rb") as f:
        assert f.read(1005)[1000:] == b"hello"
        f.seek(size - 1)
        assert f.read() == b"!"


def test_the_byte_budget_stops_the_copy_and_says_where(tmp_path):
    archive = tar_of(
        dir_member("workspace"),
        data_member("workspace/a.txt", b"a" * 1000),
        data_member("workspace/big", b"b" * 5000),
        data_member("workspace/z.txt", b"z"),
    )
    skipped = safe_extract(archive, tmp_path, byte_budget=4096)
    assert (tmp_path / "workspace" / "a.txt").read_bytes() == b"a" * 1000
    assert not (tmp_path / "workspace" / "big").exists() and not (tmp_path / "workspace" / "z.txt").exists()
    assert [s.path for s in skipped] == ["workspace/big"]
    assert "4096" in skipped[0].reason and "after it" in skipped[0].reason


def test_names_that_are_not_utf8_or_too_long_for_the_host_are_skipped_as_readable_text(tmp_path):
    long_dir = "workspace/" + "/".join(["d" * 250] * 17)  # under 4096 bytes, too long below tmp_path
    archive = tar_of(
        dir_member("workspace"),
        data_member("workspace/bad-\udcff.txt", b"x"),
        member("workspace/fifo-\udcfe", tarfile.FIFOTYPE),
        data_member(long_dir + "/deep.txt", b"x"),
        data_member("workspace/ok.txt", b"ok"),
    )
    skipped = safe_extract(archive, tmp_path)
    paths = [s.path for s in skipped]
    assert "workspace/bad-\\xff.txt" in paths and "workspace/fifo-\\xfe" in paths
    assert any(p.endswith("deep.txt") and "too long" in s.reason.lower() for p, s in zip(paths, skipped, strict=True))
    assert (tmp_path / "workspace" / "ok.txt").read_text() == "ok"
    json.dumps([s.model_dump() for s in skipped], ensure_ascii=False).encode("utf-8")  # serialisable


def test_hard_links_are_made_only_to_files_this_archive_wrote(tmp_path):
    archive = tar_of(
        dir_member("workspace"),
        data_member("workspace/a.txt", b"data"),
        member("workspace/same", tarfile.LNKTYPE, "workspace/a.txt"),
        member("workspace/l", tarfile.SYMTYPE, "a.txt"),
        member("workspace/via-link", tarfile.LNKTYPE, "workspace/l"),
    )
    skipped = safe_extract(archive, tmp_path)
    ws = tmp_path / "workspace"
    assert os.lstat(ws / "same").st_ino == os.lstat(ws / "a.txt").st_ino
    assert [s.path for s in skipped] == ["workspace/via-link"]  # never through a symlink


def test_the_list_of_skipped_members_is_bounded(tmp_path, monkeypatch):
    from softprobe.gym.providers import archive

    monkeypatch.setattr(archive, "MAX_SKIPPED_LISTED", 3)
    fifos = [member(f"workspace/fifo{i}", tarfile.FIFOTYPE) for i in range(10)]
    skipped = safe_extract(tar_of(dir_member("workspace"), *fifos), tmp_path)
    assert [s.path for s in skipped] == ["workspace/fifo0", "workspace/fifo1", "workspace/fifo2", "workspace"]
    assert "7 more members" in skipped[-1].reason
