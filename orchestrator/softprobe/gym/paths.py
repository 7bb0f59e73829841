"""Removing folders the host made, whatever an agent left in them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


def remove_tree(path: Path) -> None:
    """``rm -rf path`` (blocking), also through folders whose saved mode denies it (a
    ``chmod 500`` folder copied out of a workspace) and through trees deeper than any path the
    kernel takes (thousands of folders: ``shutil.rmtree`` recurses past Python's limit on such a
    tree, and single paths into it are too long). The system's ``chmod -R`` and ``rm -rf`` walk
    by file descriptor and follow no symlink; ``shutil`` is the fallback without them."""
    root = os.fspath(path)
    if not os.path.lexists(root):
        return
    if os.path.isdir(root) and not os.path.islink(root):
        _run_quietly(["chmod", "-R", "u+rwx", "--", root])
    if not _run_quietly(["rm", "-rf", "--", root]) and os.path.lexists(root):
        shutil.rmtree(root, ignore_errors=True)


def _run_quietly(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, check=False).returncode == 0
    except OSError:
        return False


__all__ = ["remove_tree"]
