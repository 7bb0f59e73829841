"""ChatCompletionsPolicy against the loopback test server (tests/chat_server.py), on the local
provider with the support-desk tools: what it sends, how tool calls become steps, retries, and
malformed calls as refused steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chat_server import ChatServer, fault, final, tool_calls

from softprobe.gym import HostEnvironment
from softprobe.gym.errors import ConfigurationError, InvalidActionError, LifecycleError
from softprobe.gym.evals.suite import SuiteError, load_suite
from softprobe.gym.policies import ChatCompletionsPolicy, ModelRequestError
from softprobe.gym.policies.messages import truncated
from softprobe.gym.results import StepError
from softprobe.gym.training.session import RolloutResult, create_training_session


def _policy(server: ChatServer, **options: object) -> ChatCompletionsPolicy:
    return ChatCompletionsPolicy(base_url=server.base_url, model="test-model", api_key="k-test",
                                 prompt="Refund A-42.", retry_backoff_s=0.0, **options)  # type: ignore[arg-type]


async def _run(host: HostEnvironment, policy: ChatCompletionsPolicy) -> tuple[list[object], RolloutResult]:
    session = create_training_session(host, episode_id="ep")
    events = [ev async for ev in session.rollout(policy)]
    result = await session.finalize()
    await policy.aclose()
    return events, result


async def test_tool_calls_become_steps_and_the_final_message_terminates(desk_host: HostEnvironment) -> None:
    with ChatServer([
        tool_calls(("crm__get_account", {"id": "A-42"}), prompt_tokens=100, completion_tokens=9),
        tool_calls(("fs__write", {"path": "note.md", "content": "refund A-42"})),
        final("Refund noted for A-42", prompt_tokens=300, completion_tokens=5),
    ]) as server:
        events, result = await _run(desk_host, _policy(server, temperature=0.2, seed=7, max_tokens=256,
                                                        extra_body={"top_k": 5}))
    assert events[-1].reason == "terminate_action"  # type: ignore[attr-defined]
    assert [s.action.type for s in result.steps] == ["tool", "tool", "terminate"]
    assert result.steps[0].action.name == "crm.get_account"  # type: ignore[union-attr]
    assert result.steps[0].action.args == {"id": "A-42"}  # type: ignore[union-attr]
    assert result.final_output == "Refund noted for A-42"
    assert (result.workspace_path / "note.md").read_text() == "refund A-42"  # type: ignore[operator]

    first = server.requests[0]
    assert first["model"] == "test-model" and first["temperature"] == 0.2 and first["seed"] == 7
    assert first["max_tokens"] == 256 and first["top_k"] == 5 and "top_p" not in first
    assert server.headers[0]["authorization"] == "Bearer k-test"
    functions = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert {"crm__get_account", "crm__list_accounts", "fs__read", "shell__exec"} <= set(functions)
    assert functions["crm__get_account"]["parameters"]["required"] == ["id"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][1]["content"].startswith("Refund A-42.")
    assert "hello.txt" in first["messages"][1]["content"]  # the workspace's files

    # The second request carries the first call and its observation as the tool message.
    second = server.requests[1]["messages"]
    assert second[2]["role"] == "assistant" and second[2]["tool_calls"][0]["id"] == "call_0"
    assert second[3]["role"] == "tool" and second[3]["tool_call_id"] == "call_0"
    assert "Acme" in second[3]["content"]  # the CRM account's JSON
    assert len(server.requests) == 3

    usage = [s.diagnostics["policy"] for s in result.steps]
    assert usage[0]["prompt_tokens"] == 100 and usage[0]["completion_tokens"] == 9
    assert usage[2]["prompt_tokens"] == 300 and usage[2]["call"] == 3 and usage[2]["tool_call_id"] is None
    assert all(u["model"] == "test-model" and u["latency_ms"] >= 0 and u["retries"] == 0 for u in usage)
    # The diagnostics are in the trajectory file too, not only in the returned results.
    lines = (result.artifacts_dir / "trajectory.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["diagnostics"]["policy"]["prompt_tokens"] == 100


async def test_parallel_calls_are_consecutive_steps_each_answered_by_id(desk_host: HostEnvironment) -> None:
    with ChatServer([
        tool_calls(("crm__get_account", {"id": "A-42"}), ("crm__list_accounts", {}), ("fs__list", {}),
                   content="Looking both up."),
        final("done"),
    ]) as server:
        _, result = await _run(desk_host, _policy(server))
    names = [s.action.name for s in result.steps[:3]]  # type: ignore[union-attr]
    assert names == ["crm.get_account", "crm.list_accounts", "fs.list"]
    infos = [s.diagnostics["policy"] for s in result.steps[:3]]
    assert [i["parallel_index"] for i in infos] == [0, 1, 2] and {i["call"] for i in infos} == {1}
    assert "prompt_tokens" in infos[0] and "prompt_tokens" not in infos[1]  # usage counted once
    second = server.requests[1]["messages"]
    assert second[2]["content"] == "Looking both up." and len(second[2]["tool_calls"]) == 3
    tool_messages = [m for m in second if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_0", "call_1", "call_2"]
    assert "Acme" in tool_messages[0]["content"] and "hello.txt" in tool_messages[2]["content"]


async def test_long_observations_are_cut_to_the_budget_and_say_so(desk_host: HostEnvironment) -> None:
    with ChatServer([
        tool_calls(("shell__exec", {"command": "python3 -c \"print('x' * 5000)\""})),
        final("ok"),
    ]) as server:
        _, result = await _run(desk_host, _policy(server, observation_budget_chars=100))
    assert len(result.steps[0].observation) > 5000  # the step keeps it all
    message = server.requests[1]["messages"][-1]["content"]
    assert message.startswith("x" * 100) and "x" * 101 not in message
    assert "[truncated: the first 100 of 5001 characters are shown]" in message
    assert truncated("short", 100) == "short"


async def test_malformed_calls_are_refused_steps_and_the_model_is_told(desk_host: HostEnvironment) -> None:
    with ChatServer([
        tool_calls(("fs__read", "{not json"), ("fs__read", "[1, 2]"), ("crm__refund", {"id": "A-42"}),
                   ("fs__read", {"path": "hello.txt", "extra": 1})),
        final("gave up"),
    ]) as server:
        events, result = await _run(desk_host, _policy(server))
    assert events[-1].reason == "terminate_action"  # type: ignore[attr-defined]
    refused = result.steps[:3]
    assert [s.error.type for s in refused] == ["invalid_arguments"] * 3  # type: ignore[union-attr]
    assert "not JSON" in refused[0].observation and "{not json" in refused[0].observation
    assert "must be a JSON object, not an array" in refused[1].observation
    assert "no tool of this episode" in refused[2].observation and refused[2].action.name == "crm.refund"  # type: ignore[union-attr]
    assert all(s.diagnostics["changed_paths"] == [] for s in refused)
    # A well-formed call the shim refuses is the shim's own invalid_arguments: it did reach the tool.
    assert result.steps[3].error.type == "invalid_arguments"  # type: ignore[union-attr]
    assert "extra" in result.steps[3].error.message  # type: ignore[union-attr]
    tool_messages = [m for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 4
    assert tool_messages[0]["content"].startswith("error (invalid_arguments): the arguments of fs__read are not JSON")


async def test_429_then_success_is_retried_honouring_retry_after(desk_host: HostEnvironment) -> None:
    with ChatServer([fault(429, "slow down", retry_after="0"), fault(503), final("fine")]) as server:
        _, result = await _run(desk_host, _policy(server))
    assert len(server.requests) == 3 and server.requests[0] == server.requests[2]
    assert result.final_output == "fine" and result.steps[0].diagnostics["policy"]["retries"] == 2


async def test_500_is_retried_until_the_attempts_are_spent(desk_host: HostEnvironment) -> None:
    with ChatServer([fault(500, "boom")] * 3) as server:
        session = create_training_session(desk_host, episode_id="ep")
        events = []
        with pytest.raises(ModelRequestError) as caught:
            async for ev in session.rollout(_policy(server, max_attempts=3)):
                events.append(ev)
        await desk_host.destroy(episode_id="ep")
    assert len(server.requests) == 3
    assert caught.value.status == 500 and caught.value.attempts == 3 and "boom" in caught.value.body
    assert events[-1].reason == "error" and "answered 500 to all 3" in events[-1].error  # type: ignore[attr-defined]


async def test_400_is_not_retried(desk_host: HostEnvironment) -> None:
    with ChatServer([fault(400, "unknown model 'test-model'"), final("never sent")]) as server:
        session = create_training_session(desk_host, episode_id="ep")
        with pytest.raises(ModelRequestError) as caught:
            async for _ in session.rollout(_policy(server)):
                pass
        await desk_host.destroy(episode_id="ep")
    assert len(server.requests) == 1
    assert caught.value.status == 400 and "unknown model" in caught.value.body
    assert "refused the request with 400" in str(caught.value) and "not retried" in str(caught.value)


async def test_no_server_is_a_typed_error_after_the_retries(desk_host: HostEnvironment) -> None:
    server = ChatServer()  # bound, then closed unstarted: its port refuses connections
    url = server.base_url
    server.stop()
    policy = ChatCompletionsPolicy(base_url=url, model="m", retry_backoff_s=0.0, max_attempts=2)
    session = create_training_session(desk_host, episode_id="ep")
    with pytest.raises(ModelRequestError) as caught:
        async for _ in session.rollout(policy):
            pass
    await desk_host.destroy(episode_id="ep")
    assert caught.value.status is None and caught.value.attempts == 2
    assert "could not reach" in str(caught.value)


async def test_max_turns_stops_the_conversation(desk_host: HostEnvironment) -> None:
    with ChatServer([tool_calls(("fs__list", {}))] * 2) as server:
        policy = _policy(server, max_turns=2)
        events, result = await _run(desk_host, policy)
    assert events[-1].reason == "end_of_actions" and len(result.steps) == 2  # type: ignore[attr-defined]
    assert policy.stop_reason == "max_turns" and len(server.requests) == 2


async def test_the_policy_needs_a_session(desk_host: HostEnvironment) -> None:
    policy = ChatCompletionsPolicy(base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(LifecycleError, match="session.rollout"):
        await policy({}, None)


def test_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="max_turns"):
        ChatCompletionsPolicy(base_url="http://x/v1", model="m", max_turns=0)
    with pytest.raises(ConfigurationError, match="base_url and model"):
        ChatCompletionsPolicy(base_url="http://x/v1", model="")


def test_without_openai_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openai" else real(name, *a))
    with pytest.raises(ConfigurationError, match=r"pip install 'softprobe-gym\[openai\]'"):
        ChatCompletionsPolicy(base_url="http://x/v1", model="m")


def test_api_key_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert ChatCompletionsPolicy(base_url="http://x/v1", model="m").api_key == "EMPTY"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert ChatCompletionsPolicy(base_url="http://x/v1", model="m").api_key == "sk-env"


async def test_a_refusal_is_only_for_tool_actions(desk_host: HostEnvironment) -> None:
    await desk_host.create_episode(episode_id="ep")
    await desk_host.reset(episode_id="ep")
    with pytest.raises(InvalidActionError, match="only a tool action"):
        await desk_host.step(episode_id="ep", action={"type": "terminate"},
                             refused=StepError(type="invalid_arguments", message="x"))
    await desk_host.destroy(episode_id="ep")


# -- the suite's `policy:` form --------------------------------------------------------------------

SUITE = """\
name: model suite
tasks:
  - id: refund
    policy:
      kind: chat-completions
      base_url: http://127.0.0.1:8000/v1
      model: my-model
      api_key_env: SOFTPROBE_TEST_KEY
      prompt: Refund A-42.
      temperature: 0.5
      max_turns: 4
    assert: [{type: contains, value: A-42}]
"""


def test_a_suite_declares_a_chat_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE)
    suite = load_suite(path)
    monkeypatch.setenv("SOFTPROBE_TEST_KEY", "sk-suite")
    first, second = suite.policy(suite.tasks[0]), suite.policy(suite.tasks[0])
    assert isinstance(first, ChatCompletionsPolicy) and first is not second  # one per rollout
    assert first.model == "my-model" and first.api_key == "sk-suite" and first.prompt == "Refund A-42."
    assert first.sampling == {"temperature": 0.5} and first.max_turns == 4
    monkeypatch.delenv("SOFTPROBE_TEST_KEY")
    with pytest.raises(SuiteError, match="SOFTPROBE_TEST_KEY"):
        suite.policy(suite.tasks[0])


@pytest.mark.parametrize(("old", "new", "line", "field"), [
    ("temperature: 0.5", "temperature: hot", 10, "temperature"),
    ("kind: chat-completions", "kind: gpt", 5, "kind"),
    ("max_turns: 4", "max_turns: 4\n      top_k: 5", 12, "top_k"),
    ("max_turns: 4", "max_turns: 0", 11, "max_turns"),
    ("      model: my-model\n", "", 4, "model"),
])
def test_a_bad_chat_policy_is_reported_at_its_line(tmp_path: Path, old: str, new: str, line: int, field: str) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE.replace(old, new))
    with pytest.raises(SuiteError) as caught:
        load_suite(path)
    assert f"{path}:{line}: tasks.0.policy.{field}:" in str(caught.value)


async def test_a_suite_runs_its_chat_policy(tmp_path: Path, desk_provider: object) -> None:
    from softprobe.gym import create_host_environment
    from softprobe.gym.training.rollouts import RolloutSpec, run_rollout

    with ChatServer([tool_calls(("crm__get_account", {"id": "A-42"})), final("A-42 refunded")]) as server:
        path = tmp_path / "suite.yaml"
        path.write_text(SUITE.replace("http://127.0.0.1:8000/v1", server.base_url)
                        .replace("      api_key_env: SOFTPROBE_TEST_KEY\n", ""))
        suite = load_suite(path)
        host = create_host_environment(run_root=tmp_path / "run", provider=desk_provider)  # type: ignore[arg-type]
        async with host:
            result = await run_rollout(host, RolloutSpec(episode_id="refund", actions=suite.policy(suite.tasks[0])))
    assert result.final_output == "A-42 refunded"
    assert server.requests[0]["messages"][1]["content"].startswith("Refund A-42.")


# -- retry waits and the session's PolicyStep, without a server -----------------------------------


class _Failed(Exception):
    def __init__(self, headers: dict[str, str]) -> None:
        self.response = type("R", (), {"headers": headers, "text": "busy"})()


def test_retry_after_is_read_and_capped() -> None:
    from datetime import datetime, timezone
    from email.utils import format_datetime

    from tenacity import RetryCallState

    from softprobe.gym.policies.retrying import retry_after_s, wait_for

    assert retry_after_s(_Failed({"retry-after": "3"})) == 3.0
    assert retry_after_s(_Failed({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    date = format_datetime(datetime.fromtimestamp(1_000_010, tz=timezone.utc), usegmt=True)
    assert retry_after_s(_Failed({"retry-after": date}), now=1_000_000) == 10.0
    assert retry_after_s(_Failed({"retry-after": "soon"})) is None and retry_after_s(_Failed({})) is None

    def waited(error: Exception, attempt: int) -> float:
        state = RetryCallState(None, None, (), {})
        state.attempt_number = attempt
        state.set_exception((type(error), error, None))
        return wait_for(0.5, 4.0)(state)

    assert waited(_Failed({"retry-after": "3"}), 1) == 3.0
    assert waited(_Failed({"retry-after": "3600"}), 1) == 4.0  # the cap wins over the server
    assert [waited(_Failed({}), n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]


async def test_any_policy_may_return_a_policy_step(desk_host: HostEnvironment) -> None:
    from softprobe.gym import PolicyStep  # public: a plain policy may return one

    begun: list[str] = []

    class Policy:
        def begin_rollout(self, host: HostEnvironment, episode_id: str) -> None:
            begun.append(episode_id)

        def __call__(self, observation: object, last: object) -> PolicyStep | None:
            if last is None:
                return PolicyStep(action={"type": "tool", "name": "fs.list", "args": {}}, diagnostics={"mine": 1})
            return None

    session = create_training_session(desk_host, episode_id="ep")
    async for _ in session.rollout(Policy()):
        pass
    result = await session.finalize()
    assert begun == ["ep"] and result.steps[0].diagnostics["mine"] == 1
    assert "hello.txt" in json.dumps(result.steps[0].observation)
