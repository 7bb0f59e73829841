"""An episode's folder: claimed by one host only, and removable whatever modes it was given."""

from __future__ import annotations

import os

import pytest

from softprobe.gym import EpisodeExistsError, GymError
from softprobe.gym.episodes.store import EpisodeStore, remove_tree


def test_a_folder_that_holds_records_cannot_be_claimed_again(tmp_path):
    first = EpisodeStore(tmp_path, "ep-1")
    first.create({"episode_id": "ep-1"})
    first.trajectory_path.write_text('{"index": 1}\n')
    before = {p.name: p.read_bytes() for p in first.dir.iterdir()}
    with pytest.raises(EpisodeExistsError, match="already holds the records") as caught:
        EpisodeStore(tmp_path, "ep-1").create({"episode_id": "ep-1", "other": True})
    assert isinstance(caught.value, GymError)
    assert {p.name: p.read_bytes() for p in first.dir.iterdir()} == before


def test_a_trajectory_alone_also_counts_as_records(tmp_path):
    folder = tmp_path / "episodes" / "ep-2"
    folder.mkdir(parents=True)
    (folder / "trajectory.jsonl").write_text("{}\n")
    with pytest.raises(EpisodeExistsError):
        EpisodeStore(tmp_path, "ep-2").create({})
    assert not (folder / "episode.json").exists()


def test_an_empty_folder_can_be_claimed(tmp_path):
    (tmp_path / "episodes" / "ep-3").mkdir(parents=True)
    EpisodeStore(tmp_path, "ep-3").create({"episode_id": "ep-3"})


def test_remove_tree_gets_through_folders_saved_without_permissions(tmp_path):
    locked = tmp_path / "ws" / "locked" / "inner"
    locked.mkdir(parents=True)
    (locked / "f").write_text("x")
    os.chmod(locked / "f", 0)
    os.chmod(locked, 0o500)
    os.chmod(locked.parent, 0)
    remove_tree(tmp_path / "ws")
    assert not (tmp_path / "ws").exists()
