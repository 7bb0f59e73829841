"""``softprobe-gym bundle`` and ``eval`` without an engine: a malformed bundle fails with its
line before anything is built or stored, and the help texts say what the commands do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bundle_fixtures import write_bundle_folder


def run_cli(*args: str, store: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"SOFTPROBE_GYM_BUNDLE_STORE": str(store)} if store is not None else {})}
    return subprocess.run([sys.executable, "-m", "softprobe.gym.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_a_malformed_bundle_fails_with_its_line(tmp_path: Path) -> None:
    folder = write_bundle_folder(tmp_path / "bad", "schema: softprobe.environment-bundle/v1\nname: bad\nimage: x\n"
                                 "ports: [80]\n")
    done = run_cli("bundle", "build", str(folder), store=tmp_path / "store")
    assert done.returncode == 1 and done.stdout == ""
    assert f"{folder / 'bundle.yaml'}:4:1: ports: unknown key 'ports'" in done.stderr
    assert not (tmp_path / "store").exists()


def test_an_absolute_compose_build_context_fails_with_its_line_not_a_traceback(tmp_path: Path) -> None:
    folder = write_bundle_folder(tmp_path / "b1", "schema: softprobe.environment-bundle/v1\nname: b1\nimage: x\n"
                                 "compose: compose.yaml\n", {"compose.yaml": "services:\n  api:\n    build: /etc\n"})
    done = run_cli("bundle", "build", str(folder), store=tmp_path / "store")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{folder / 'compose.yaml'}:3:5: services.api.build: the build context '/etc' is absolute" in done.stderr


def test_help_texts() -> None:
    done = run_cli("bundle", "--help")
    assert done.returncode == 0
    for command in ("build", "inspect", "run"):
        assert command in done.stdout
    evaluate = run_cli("eval", "--help")
    assert evaluate.returncode == 0 and "bundle: DIR" in " ".join(evaluate.stdout.split())
