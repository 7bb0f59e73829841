"""The per-step overhead ChatCompletionsPolicy adds over a scripted rollout of the same actions,
side by side in one run, with the loopback test server (tests/chat_server.py) as the model.

    PYTHONPATH=orchestrator python tests/chat_policy_overhead.py [--docker] [--steps 20] [--rounds 5]

Each round runs the same N ``crm.get_account`` steps plus a terminate twice on one host: once
as a list of actions, once from the policy (one model call per step, then a final answer), in
alternating order. Printed: the median per-step time of each and the difference, which is the
policy's cost: a request to the server and back, building the messages, parsing the reply.
The local provider (default) runs each tool as a host process; ``--docker`` runs the
support-desk image. The request's own round trip (``latency_ms`` in the step diagnostics) is
printed too: the rest of the overhead is the policy's own work.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chat_server import ChatServer, final, tool_calls  # noqa: E402
from helpers import SUPPORT_DESK, desk_manifest  # noqa: E402

from softprobe.gym import HostEnvironment, create_host_environment  # noqa: E402
from softprobe.gym.policies import ChatCompletionsPolicy  # noqa: E402
from softprobe.gym.providers.local import LocalProvider  # noqa: E402
from softprobe.gym.training.session import create_training_session  # noqa: E402


async def _per_step_ms(
    host: HostEnvironment, episode_id: str, source: Any, steps: int, latencies: list[float]
) -> float:
    session = create_training_session(host, episode_id=episode_id)
    rollout = session.rollout(source)
    await rollout.__anext__()  # the reset is not a step: the clock starts after it
    started = time.perf_counter()
    count = 0
    async for event in rollout:
        if event.type == "step":
            count += 1
            latency = event.step_result.diagnostics.get("policy", {}).get("latency_ms")
            if latency is not None:
                latencies.append(latency)
    elapsed = time.perf_counter() - started
    assert count == steps + 1, f"{count} steps, expected {steps + 1}"
    await host.destroy(episode_id=episode_id)
    return elapsed * 1000 / count


async def main(docker: bool, steps: int, rounds: int) -> None:
    actions: list[dict[str, Any]] = [{"type": "tool", "name": "crm.get_account", "args": {"id": "A-42"}}] * steps
    actions = [*actions, {"type": "terminate", "output": "done"}]
    with tempfile.TemporaryDirectory(prefix="chat-overhead-") as tmp:
        root = Path(tmp)
        provider = None if docker else LocalProvider(root=root / "local", manifest=desk_manifest(root))
        options: dict[str, Any] = {"image": SUPPORT_DESK} if docker else {"provider": provider}
        host = create_host_environment(run_root=root / "run", **options)
        scripted_ms: list[float] = []
        policy_ms: list[float] = []
        latencies: list[float] = []  # each model request's round trip, as the policy measured it
        try:
            with ChatServer() as server:
                for round_ in range(rounds):
                    server.add(*[tool_calls(("crm__get_account", {"id": "A-42"}))] * steps, final("done"))
                    policy = ChatCompletionsPolicy(base_url=server.base_url, model="scripted", max_turns=steps + 1)
                    runs = [("scripted", actions), ("policy", policy)]
                    for name, source in runs if round_ % 2 == 0 else runs[::-1]:
                        ms = await _per_step_ms(host, f"{name}-{round_}", source, steps, latencies)
                        (scripted_ms if name == "scripted" else policy_ms).append(ms)
                    await policy.aclose()
        finally:
            await host.close()
            if provider is not None:
                await provider.close()
    s, p = statistics.median(scripted_ms), statistics.median(policy_ms)
    print(f"provider={'docker' if docker else 'local'} steps/rollout={steps + 1} rounds={rounds}")
    print(f"scripted  per step: median {s:7.2f} ms   (rounds: {', '.join(f'{x:.2f}' for x in scripted_ms)})")
    print(f"policy    per step: median {p:7.2f} ms   (rounds: {', '.join(f'{x:.2f}' for x in policy_ms)})")
    print(f"overhead  per step: {p - s:7.2f} ms ({(p - s) / s * 100:.0f}%); of which the model request's "
          f"round trip (client and test server): median {statistics.median(latencies):.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docker", action="store_true", help="run on the support-desk image (default: local provider)")
    parser.add_argument("--steps", type=int, default=20, help="tool steps per rollout (plus a terminate)")
    parser.add_argument("--rounds", type=int, default=5, help="rollouts of each kind")
    args = parser.parse_args()
    asyncio.run(main(args.docker, args.steps, args.rounds))
