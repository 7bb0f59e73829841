"""Text crossing a boundary: readable names from containers, agent text safe on a terminal."""

from __future__ import annotations

import json

import pytest

from softprobe.gym.text import readable, readable_text, terminal_safe


def test_bytes_that_were_not_utf8_come_out_as_visible_escapes():
    assert readable_text("bad-\udcff.txt") == "bad-\\xff.txt"  # as the shim shows such bytes
    assert readable_text("lone-\ud800") == "lone-\\ud800"
    assert readable_text("fine é") == "fine é"


def test_every_string_of_a_json_value_is_made_readable_keys_included():
    value = readable({"a\udcfe": ["x\ud800", {"name": "f\udcff"}], "n": 1.5, "ok": None})
    assert value == {"a\\xfe": ["x\\ud800", {"name": "f\\xff"}], "n": 1.5, "ok": None}
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # always writable as UTF-8 JSON


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("FAIL\rpass", "FAIL\\rpass"),
        ("\x1b[2K\x1b[1Apass", "\\x1b[2K\\x1b[1Apass"),
        ("a\x08b\x07", "a\\x08b\\x07"),
        ("csi\x9b2J", "csi\\x9b2J"),  # the one-byte C1 form of ESC [
        ("bidi\u202eFAIL", "bidi\\u202eFAIL"),
        ("two\nlines", "two\\nlines"),
    ],
)
def test_terminal_output_shows_control_characters_instead_of_obeying_them(raw, shown):
    assert terminal_safe(raw) == shown


def test_multi_line_blocks_may_keep_their_newlines():
    assert terminal_safe("one\ntwo\r", keep_newlines=True) == "one\ntwo\\r"


def test_eval_progress_lines_escape_agent_text(capsys):
    from softprobe.gym.evals.runner import plain_progress

    plain_progress("task-1: failed: RuntimeError: \r\x1b[2K[5/5] all passed", 1, 5)
    err = capsys.readouterr().err
    assert "\r" not in err and "\x1b" not in err and "\\r\\x1b[2K" in err


def test_demo_steps_escape_observations_and_changed_paths():
    from softprobe.gym.actions import parse_action
    from softprobe.gym.cli.demo import format_step
    from softprobe.gym.results import StepResult

    step = StepResult(
        episode_id="e", index=1, action=parse_action({"type": "tool", "name": "shell.exec", "args": {"command": "x"}}),
        observation="ok\x1b]0;title\x07\rfake", diagnostics={"changed_paths": ["a\x1b[31m"]},
    )
    shown = format_step(step)
    assert "\x1b" not in shown and "\r" not in shown and "\x07" not in shown
