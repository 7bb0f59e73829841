"""The Gymnasium adapter on its default provider, Docker, with the support-desk image's tools.
Everything else about the adapter is tested on the local provider (tests/unit/test_gymnasium_env.py)."""

from __future__ import annotations

import json

import pytest
from helpers import require_extra  # noqa: E402

require_extra("gymnasium", "gymnasium")

from helpers import SUPPORT_DESK  # noqa: E402

from softprobe.gym.training.gymnasium import SoftprobeEnv  # noqa: E402

pytestmark = pytest.mark.docker


@pytest.fixture
def env(docker_engine):
    def facts(ctx):
        return {"checks": [{"name": "found_account", "passed": ctx.step_result.error is None}]}

    environment = SoftprobeEnv(image=SUPPORT_DESK, reward_from=facts, max_episode_steps=5)
    yield environment
    environment.close()


def test_reset_and_step_follow_the_gymnasium_contract(env):
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert "crm.get_account" in json.loads(obs)["tools"] and info["workspace_digest"].startswith("sha256:")
    obs, reward, terminated, truncated, info = env.step('{"type": "tool", "name": "crm.get_account", "args": {"id": "A-42"}}')
    assert json.loads(obs)["observation"]["id"] == "A-42"
    assert (reward, terminated, truncated) == (1.0, False, False)
    assert info["reward_components"] == [{"kind": "check", "name": "found_account", "value": 1.0}]
    obs, reward, *_ = env.step({"type": "tool", "name": "crm.get_account", "args": {"id": "nope"}})
    assert json.loads(obs)["error"]["type"] == "tool_failed" and reward == 0.0
    *_, terminated, truncated, _ = env.step({"type": "terminate", "output": "done"})
    assert terminated and not truncated
