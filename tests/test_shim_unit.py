"""The shim's pure parts, run in-process: workspace digest, output cap, path confinement."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from softprobe.gym.shim import agent_shim as shim


def make_tree(root: Path) -> None:
    (root / "a").mkdir()
    (root / "a" / "one.txt").write_text("one")
    (root / "two.txt").write_text("two")
    os.symlink("two.txt", root / "link")


def digest(root: Path) -> str:
    index = shim.WorkspaceIndex(str(root))
    index.scan()
    return index.digest


def test_equal_worlds_have_equal_digests(tmp_path):
    left, right = tmp_path / "left", tmp_path / "right"
    left.mkdir(), right.mkdir()
    make_tree(left)
    make_tree(right)
    os.utime(right / "two.txt", (0, 0))  # times do not count
    assert digest(left) == digest(right)


@pytest.mark.parametrize(
    "change",
    [
        lambda r: (r / "two.txt").write_text("TWO"),  # content, same size
        lambda r: os.chmod(r / "two.txt", 0o600),  # mode
        lambda r: (r / "two.txt").rename(r / "three.txt"),  # path
        lambda r: (r / "a" / "new").mkdir(),  # empty directory
        lambda r: (os.unlink(r / "link"), os.symlink("a", r / "link")),  # link target
    ],
    ids=["content", "mode", "rename", "empty-dir", "symlink-target"],
)
def test_any_change_of_path_content_or_mode_changes_the_digest(tmp_path, change):
    make_tree(tmp_path)
    before = digest(tmp_path)
    change(tmp_path)
    assert digest(tmp_path) != before


def test_repeat_scans_report_exactly_what_changed(tmp_path):
    make_tree(tmp_path)
    index = shim.WorkspaceIndex(str(tmp_path))
    index.scan()
    assert index.scan() == []
    (tmp_path / "a" / "one.txt").write_text("uno")
    (tmp_path / "two.txt").unlink()
    assert index.scan() == ["a/one.txt", "two.txt"]


def test_a_same_size_rewrite_right_after_a_scan_is_not_missed(tmp_path):
    # Racy-clean: mtime and size may be unchanged within one clock tick; the cache must not lie.
    (tmp_path / "f").write_text("aaaa")
    index = shim.WorkspaceIndex(str(tmp_path))
    index.scan()
    stat = os.stat(tmp_path / "f")
    (tmp_path / "f").write_text("bbbb")
    os.utime(tmp_path / "f", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert index.scan() == ["f"]


def test_incremental_update_agrees_with_a_full_scan(tmp_path):
    make_tree(tmp_path)
    index = shim.WorkspaceIndex(str(tmp_path))
    index.scan()
    (tmp_path / "a" / "deep").mkdir()
    (tmp_path / "a" / "deep" / "f.txt").write_text("x")
    changed = index.update_paths([b"a/deep/f.txt"])
    assert changed == ["a/deep", "a/deep/f.txt"]
    assert index.digest == digest(tmp_path)
    import shutil

    shutil.rmtree(tmp_path / "a")
    index.update_paths([b"a"])
    assert index.digest == digest(tmp_path)


def test_output_cap_keeps_head_and_tail_around_a_marker():
    out = shim.CappedOutput(1000)
    out.add(b"H" * 600)
    for _ in range(100):
        out.add(b"m" * 1000)
    out.add(b"T" * 600)
    text = out.text()
    assert out.truncated and out.total == 101_200
    assert text.startswith("H" * 500)
    assert text.endswith("T" * 500)
    assert "[... softprobe-gym: 100200 bytes of output truncated ...]" in text
    assert len(out.tail) <= 1000  # memory stays bounded whatever the flood


def test_output_under_the_cap_is_kept_whole():
    out = shim.CappedOutput(1000)
    out.add(b"abc")
    assert out.text() == "abc" and not out.truncated


@pytest.fixture
def tools(tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "in.txt").write_text("inside")
    (tmp_path / "secret.txt").write_text("secret")
    os.symlink(str(tmp_path), workspace / "escape")
    os.symlink("in.txt", workspace / "alias")
    return shim.Shim(str(workspace), str(tmp_path / "no-manifest.json"))


@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd", "escape/secret.txt", "a/../../secret.txt"])
def test_file_tools_refuse_paths_outside_the_workspace(tools, path):
    for name, args in [
        ("fs.read", {"path": path}),
        ("fs.write", {"path": path, "content": "x"}),
        ("fs.list", {"path": path}),
        ("fs.delete", {"path": path}),
    ]:
        result = tools.call({"tool": name, "args": args})
        assert result["error"]["type"] == "path_outside_workspace", (name, path, result)


def test_symlinks_inside_the_workspace_are_followed(tools):
    assert tools.call({"tool": "fs.read", "args": {"path": "alias"}})["observation"] == "inside"


def test_deleting_a_symlink_removes_the_link_not_its_target(tools, tmp_path):
    result = tools.call({"tool": "fs.delete", "args": {"path": "escape"}})
    assert result["error"] is None
    assert (tmp_path / "secret.txt").exists()
    assert not os.path.lexists(tmp_path / "ws" / "escape")


@pytest.mark.parametrize(
    "args, error",
    [
        ({}, "missing required argument 'path'"),
        ({"path": 3}, "wrong type"),
        ({"path": "in.txt", "bogus": 1}, "unexpected argument 'bogus'"),
    ],
)
def test_bad_arguments_are_agent_errors_not_crashes(tools, args, error):
    result = tools.call({"tool": "fs.read", "args": args})
    assert result["error"]["type"] == "invalid_arguments"
    assert error in result["error"]["message"]
    assert result["observation"].startswith("error (invalid_arguments)")


def test_unknown_tools_list_the_available_ones(tools):
    result = tools.call({"tool": "fs.teleport", "args": {}})
    assert result["error"]["type"] == "unknown_tool"
    assert "fs.read" in result["error"]["message"]


def test_declared_tool_arguments_are_checked_against_the_manifest_schema():
    schema = {"required": ["id"], "properties": {"id": {"type": "string"}}, "additionalProperties": False}
    shim._check_schema({"id": "A-42"}, schema)
    for bad, message in [({}, "missing"), ({"id": 42}, "type string"), ({"id": "x", "y": 1}, "unexpected")]:
        with pytest.raises(shim.ToolError, match=message):
            shim._check_schema(bad, schema)
