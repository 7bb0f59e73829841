"""The ``policy:`` mapping a suite task may give instead of ``module:function``.

```yaml
policy:
  kind: chat-completions
  base_url: http://localhost:8000/v1
  model: Qwen/Qwen2.5-7B-Instruct
  api_key_env: OPENAI_API_KEY      # optional: the variable holding the key
  prompt: Refund the duplicate charge of A-42.
  temperature: 0.2
```
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from softprobe.gym.errors import ConfigurationError
from softprobe.gym.policies.chat import DEFAULT_SYSTEM_PROMPT, ChatCompletionsPolicy


class ChatPolicySpec(BaseModel):
    """A :class:`ChatCompletionsPolicy` as a suite declares it (its options, by the same names;
    the key comes from the environment variable ``api_key_env``, never from the file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["chat-completions"]
    base_url: str = Field(min_length=1)
    model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, min_length=1)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    prompt: str | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    extra_body: dict[str, Any] | None = None
    max_turns: int = Field(default=32, ge=1)
    observation_budget_chars: int = Field(default=16_000, ge=1)
    request_timeout_s: float = Field(default=120.0, gt=0)
    max_attempts: int = Field(default=5, ge=1)

    def build(self) -> ChatCompletionsPolicy:
        """A new policy (one per rollout: a policy holds one conversation at a time).

        Raises:
            ConfigurationError: ``api_key_env`` names a variable that is not set, or the
                ``openai`` package is missing.
        """
        api_key = None  # the policy's default: OPENAI_API_KEY, else "EMPTY"
        if self.api_key_env is not None:
            api_key = os.environ.get(self.api_key_env)
            if api_key is None:
                raise ConfigurationError(
                    f"api_key_env names {self.api_key_env}, which is not set; export it, or leave "
                    "api_key_env out for a server that needs no key"
                )
        options = self.model_dump(exclude={"kind", "api_key_env"})
        return ChatCompletionsPolicy(api_key=api_key, **options)


__all__ = ["ChatPolicySpec"]
