"""ChatCompletionsPolicy on the real engine: a scripted model (tests/chat_server.py) works the
support-desk world's refund ticket in a container: the image's CRM tools are what it is offered,
its calls run in the container, a malformed call is a refused step, and the final workspace
holds what it wrote. The policy's logic is tested on the local provider
(tests/unit/test_chat_policy.py)."""

from __future__ import annotations

import json

import pytest
from chat_server import ChatServer, final, tool_calls
from helpers import host_containers

from softprobe.gym import HostEnvironment
from softprobe.gym.policies import ChatCompletionsPolicy
from softprobe.gym.training.session import create_training_session

pytestmark = pytest.mark.docker


async def test_a_scripted_model_works_a_refund_in_the_support_desk_image(host: HostEnvironment) -> None:
    with ChatServer([
        tool_calls(("crm__list_accounts", {}), ("crm__get_account", "{'id': 'A-42'}"), prompt_tokens=120),
        tool_calls(("crm__get_account", {"id": "A-42"})),
        tool_calls(("fs__write", {"path": "refund-note.md", "content": "Refund $120 to A-42 for T-1001"}),
                   ("shell__exec", {"command": "id -u && cat refund-note.md"})),
        final("Refunded $120 to account A-42 (ticket T-1001)."),
    ]) as server:
        policy = ChatCompletionsPolicy(base_url=server.base_url, model="scripted", prompt="Work ticket T-1001.",
                                       retry_backoff_s=0.0)
        session = create_training_session(host, episode_id="chat")
        events = [ev async for ev in session.rollout(policy)]
        assert host_containers(host), "the episode runs in a container of this host"
        result = await session.finalize()
        await host.destroy(episode_id="chat")
        await policy.aclose()

    assert events[-1].reason == "terminate_action"  # type: ignore[union-attr]
    offered = {t["function"]["name"] for t in server.requests[0]["tools"]}
    assert {"crm__get_account", "crm__list_accounts", "fs__write", "shell__exec"} <= offered
    steps = result.steps
    assert [s.action.type for s in steps] == ["tool"] * 5 + ["terminate"]
    assert "A-42" in json.dumps(steps[0].observation)  # the image's CRM answered, in the container
    assert steps[1].error is not None and steps[1].error.type == "invalid_arguments"  # single quotes
    assert steps[2].error is None and "Acme" in json.dumps(steps[2].observation)
    uid, note = steps[4].observation.split("\n", 1)
    assert uid != "0" and note.startswith("Refund $120 to A-42")  # the agent's uid, not root
    assert result.final_output == "Refunded $120 to account A-42 (ticket T-1001)."
    assert (result.workspace_path / "refund-note.md").read_text() == "Refund $120 to A-42 for T-1001"  # type: ignore[operator]
    assert steps[0].diagnostics["policy"]["prompt_tokens"] == 120
    # The refused call's tool message told the model what was wrong.
    told = [m for m in server.requests[1]["messages"] if m["role"] == "tool"]
    assert told[1]["tool_call_id"] == "call_1" and "not JSON" in told[1]["content"]
    assert not host_containers(host)
