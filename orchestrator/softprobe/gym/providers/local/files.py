"""Copying a local sandbox's workspace: whole (commit, restore) or through a tar (copy out),
whatever an agent left in it (FIFOs, unreadable files, deep trees)."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path
from typing import BinaryIO

from softprobe.gym.errors import SandboxError
from softprobe.gym.results import SkippedMember
from softprobe.gym.text import readable_text


def copy_tree(source: Path, target: Path) -> None:
    """``cp -a source target`` (blocking): modes, links, FIFOs and sparse files kept.

    Raises:
        SandboxError: something could not be copied (e.g. a file its owner made unreadable).
    """
    done = subprocess.run(["cp", "-a", "--", str(source), str(target)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SandboxError(f"copying the workspace failed: {done.stderr.strip()[-500:]}")


def tar_tree(workspace: Path, spool: BinaryIO) -> list[SkippedMember]:
    """Write ``workspace`` as ``workspace/...`` into a tar on ``spool`` (blocking).

    An entry that cannot be read is left out and returned as a skipped member, so one bad file
    never costs the rest of the copy.
    """
    skipped: list[SkippedMember] = []
    with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.add(str(workspace), arcname="workspace", recursive=False)
        for folder, dirnames, filenames in os.walk(workspace):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                path = os.path.join(folder, name)
                arcname = "workspace/" + os.path.relpath(path, workspace)
                try:
                    archive.add(path, arcname=arcname, recursive=False)
                except OSError as err:
                    skipped.append(SkippedMember(path=readable_text(arcname), reason=f"unreadable: {err.strerror}"))
    return skipped


__all__ = ["copy_tree", "tar_tree"]
