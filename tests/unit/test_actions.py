"""Action validation: what is not an action is refused before anything runs."""

import pytest

from softprobe.gym import InvalidActionError, TerminateAction, ToolAction, parse_action
from softprobe.gym.actions import MAX_ACTION_BYTES


def test_dicts_and_models_parse_to_the_same_model():
    as_dict = parse_action({"type": "tool", "name": "fs.read", "args": {"path": "a"}})
    as_model = parse_action(ToolAction(name="fs.read", args={"path": "a"}))
    assert as_dict == as_model
    assert parse_action({"type": "terminate"}) == TerminateAction()
    assert parse_action({"type": "terminate", "output": "done"}).output == "done"


def test_tool_args_default_to_an_empty_object():
    assert parse_action({"type": "tool", "name": "fs.list"}).args == {}


@pytest.mark.parametrize(
    "action, fragment",
    [
        (None, "must be a dict"),
        ("fs.read", "must be a dict"),
        ({"name": "fs.read"}, "type"),
        ({"type": "dance"}, "type"),
        ({"type": "tool"}, "name"),
        ({"type": "tool", "name": ""}, "name"),
        ({"type": "tool", "name": 3}, "name"),
        ({"type": "tool", "name": "fs.read", "args": [1, 2]}, "args"),
        ({"type": "tool", "name": "fs.read", "args": {}, "extra": 1}, "extra"),
        ({"type": "terminate", "output": 42}, "output"),
    ],
)
def test_malformed_actions_raise_a_typed_error_naming_the_problem(action, fragment):
    with pytest.raises(InvalidActionError) as caught:
        parse_action(action)
    assert fragment in str(caught.value)
    assert isinstance(caught.value, ValueError)  # usable as a plain ValueError too


def test_text_that_is_not_unicode_is_refused():
    with pytest.raises(InvalidActionError, match="not valid Unicode"):
        parse_action({"type": "tool", "name": "fs.write", "args": {"path": "a", "content": "\udcff"}})


def test_nesting_too_deep_to_encode_is_refused():
    deep: dict = {}
    for _ in range(5000):
        deep = {"x": deep}
    with pytest.raises(InvalidActionError, match="nested too deeply"):
        parse_action({"type": "tool", "name": "fs.write", "args": deep})


def test_oversized_actions_are_refused():
    huge = "x" * (MAX_ACTION_BYTES + 1)
    with pytest.raises(InvalidActionError, match="exceeds"):
        parse_action({"type": "tool", "name": "fs.write", "args": {"path": "a", "content": huge}})


@pytest.mark.parametrize(
    "value, fragment",
    [
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (float("-inf"), "finite"),
        (10**400, "64-bit"),
        (-(2**63) - 1, "64-bit"),
        ({"deep": [1, {"x": float("nan")}]}, "finite"),
        (b"raw bytes", "bytes"),
        ({1: "int key"}, "not text"),
    ],
    ids=["nan", "inf", "-inf", "10**400", "below-int64", "nested-nan", "bytes", "int-key"],
)
def test_numbers_must_be_finite_and_bounded_and_values_plain_json(value, fragment):
    with pytest.raises(InvalidActionError, match=fragment):
        parse_action({"type": "tool", "name": "shell.exec", "args": {"command": "true", "timeout_s": value}})


def test_the_largest_finite_values_still_pass():
    parse_action({"type": "tool", "name": "shell.exec", "args": {"command": "true", "timeout_s": 2**63 - 1}})
    parse_action({"type": "tool", "name": "shell.exec", "args": {"command": "true", "timeout_s": 1.7e308}})


@pytest.mark.parametrize(
    "action",
    [
        {"type": "tool", "name": "fs.read", "args": {"pa\ud800th": "x"}},
        {"type": "tool", "name": "fs.read", "args": {"path": {"k\udcff": "x"}}},
        {"type": "tool", "name": "fs.read\ud800"},
        {"type": "terminate", "output": "\ud800"},
        {"type": "terminate", "out\ud800put": "x"},
        ToolAction(name="fs.read", args={"\ud800": 1}),
    ],
    ids=["arg-key", "nested-key", "name", "output", "action-key", "model"],
)
def test_lone_surrogates_are_refused_anywhere_keys_included(action):
    with pytest.raises(InvalidActionError, match="(?i)unicode"):
        parse_action(action)


def test_json_text_actions_refuse_nan_and_infinity():
    from softprobe.gym.actions import loads_action

    assert loads_action('{"type": "terminate"}') == {"type": "terminate"}
    for text in ['{"t": NaN}', '{"t": Infinity}', '{"t": -Infinity}', "not json"]:
        with pytest.raises(InvalidActionError, match="not JSON"):
            loads_action(text)


def test_the_size_limit_applies_to_the_json_that_is_sent():
    from softprobe.gym.actions import encoded_size, wire_json

    action = parse_action({"type": "tool", "name": "fs.write", "args": {"path": "a", "content": "é" * 10}})
    assert encoded_size(action) == len(wire_json(action.args))
