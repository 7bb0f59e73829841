"""Policies that drive an episode from a model: :class:`ChatCompletionsPolicy` asks an
OpenAI-compatible Chat Completions endpoint (needs the ``openai`` extra:
``pip install 'softprobe-gym[openai]'``; importing this package does not import it)."""

from softprobe.gym.policies.chat import DEFAULT_SYSTEM_PROMPT, ChatCompletionsPolicy
from softprobe.gym.policies.errors import ModelRequestError

__all__ = ["DEFAULT_SYSTEM_PROMPT", "ChatCompletionsPolicy", "ModelRequestError"]
