"""The command line: the demo (the main job) and truthful help texts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from softprobe.gym.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "softprobe.gym.cli", *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.docker
def test_demo_runs_the_support_desk_story_and_exits_0(tmp_path):
    done = run_cli("demo", "--run-root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for expected in ["crm.get_account", "refund-note.md", "terminate", "final output:", "artifacts:"]:
        assert expected in out
    (episode_dir,) = (tmp_path / "episodes").iterdir()
    note = (episode_dir / "workspace" / "refund-note.md").read_text()
    assert "A-42" in note and "T-1001" in note
    assert len((episode_dir / "trajectory.jsonl").read_text().splitlines()) == 3


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for command in ["demo", "gc", "images"]:
        assert command in out


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage:" in capsys.readouterr().out


def test_errors_are_one_line_with_exit_1(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    assert main(["gc"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("softprobe-gym: error: no Docker engine answers") and "Traceback" not in err
