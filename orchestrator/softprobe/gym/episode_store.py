"""An episode's folder under ``run_root``: its record, action log and final artifacts.

Layout of ``run_root/episodes/<episode_id>/``:
    episode.json      the episode's id, state, image, container, lineage (updated on changes)
    trajectory.jsonl  one StepResult per line, appended and flushed as each step completes
    result.json       the FinalizeResult (written by finalize)
    workspace/        the final /workspace (written by finalize)
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from .errors import ConfigurationError
from .results import StepResult

EPISODE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_episode_id(episode_id: str) -> str:
    """Episode ids name folders and Docker labels, so they are restricted to a safe alphabet."""
    if not isinstance(episode_id, str) or not EPISODE_ID_PATTERN.match(episode_id):
        raise ConfigurationError(
            f"invalid episode_id {episode_id!r}: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return episode_id


class EpisodeStore:
    """Reads and writes one episode's folder."""

    def __init__(self, run_root: Path, episode_id: str) -> None:
        self._log: Any = None  # the open trajectory file
        self.dir = run_root / "episodes" / episode_id
        self.trajectory_path = self.dir / "trajectory.jsonl"
        self.result_path = self.dir / "result.json"
        self.record_path = self.dir / "episode.json"
        self.workspace_path = self.dir / "workspace"

    def create(self, record: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.write_record(record)
        self.start_trajectory()

    def write_record(self, record: dict[str, Any]) -> None:
        _atomic_write(self.record_path, json.dumps(record, indent=2, default=str))

    def start_trajectory(self) -> None:
        """A reset starts the action log over."""
        self.close_trajectory()
        self._log = open(self.trajectory_path, "w", encoding="utf-8")

    def append_step(self, step: StepResult) -> None:
        """Append one line and flush it, so a crashed process leaves a readable log."""
        if self._log is None:
            self._log = open(self.trajectory_path, "a", encoding="utf-8")
        self._log.write(step.model_dump_json() + "\n")
        self._log.flush()

    def close_trajectory(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def write_result(self, result_json: str) -> None:
        _atomic_write(self.result_path, result_json)

    def clear_workspace(self) -> None:
        shutil.rmtree(self.workspace_path, ignore_errors=True)

    def remove(self) -> None:
        self.close_trajectory()
        shutil.rmtree(self.dir, ignore_errors=True)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
