"""The per-step cost of dependency tapes, side by side in one run: the same steps with
``tape_mode`` off, record and replay, on the billing world (Docker).

    PYTHONPATH=orchestrator python tests/tape_overhead.py [--steps 30] [--rounds 3]

Each round runs, in turn, an episode with the tape off, one recording and one replaying what the
recording took. Two kinds of step are timed:

- ``billing.get_invoice``: a declared (overlay) tool that asks the billing service over HTTP;
  recorded as one ``TOOL_CALL`` entry, replayed without running the tool;
- ``shell.exec`` writing a small file, with ``record_processes=True``: one ``CHILD_PROCESS``
  entry plus its workspace change set; replayed without running the command, the change set
  applied by the shim.

Printed: the median step time of each mode and the ratio to ``off``, and the size of one
recorded tape folder (``tape.jsonl``, payloads and the change-set sidecar).
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

from helpers import ready, tool  # noqa: E402

from softprobe.gym import create_host_environment  # noqa: E402

WORLD = Path(__file__).resolve().parents[1] / "images" / "support-desk-billing"


def _actions(kind: str, steps: int) -> list[dict[str, Any]]:
    if kind == "tool":
        return [tool("billing.get_invoice", id="INV-1001") for _ in range(steps)]
    return [tool("shell.exec", command=f"echo {i} > out-{i % 4}.txt") for i in range(steps)]


async def _episode(root: Path, name: str, mode: str, actions: list[dict[str, Any]], tape: Path | None) -> tuple[
        list[float], Path | None]:
    options: dict[str, Any] = {"tape_mode": mode, "record_processes": True}
    if tape is not None:
        options["tape"] = tape
    async with create_host_environment(run_root=root / name, bundle=WORLD, **options) as host:
        episode = await ready(host, name)
        times = []
        for action in actions:
            started = time.perf_counter()
            result = await host.step(episode_id=episode, action=action)
            times.append((time.perf_counter() - started) * 1000)
            assert result.error is None, result.error
        final = await host.finalize(episode_id=episode)
    return times, final.episode_dir / "tape" if mode == "record" else None


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


async def main(steps: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="softprobe-tape-cost-") as tmp:
        root = Path(tmp)
        for kind in ("tool", "process"):
            actions = _actions(kind, steps)
            times: dict[str, list[float]] = {"off": [], "record": [], "replay": []}
            size = 0
            for r in range(rounds):
                off, _ = await _episode(root, f"{kind}-off-{r}", "off", actions, None)
                record, tape = await _episode(root, f"{kind}-rec-{r}", "record", actions, None)
                assert tape is not None
                replay, _ = await _episode(root, f"{kind}-rep-{r}", "replay", actions, tape)
                times["off"] += off[1:]  # the first step of an episode warms caches: left out
                times["record"] += record[1:]
                times["replay"] += replay[1:]
                size = _size(tape)
            base = statistics.median(times["off"])
            cells = ", ".join(f"{mode} {statistics.median(v):.2f} ms ({statistics.median(v) / base:.2f}x)"
                              for mode, v in times.items())
            print(f"{kind:8} ({len(times['off'])} steps each): {cells}; one tape of {steps} steps: {size:,} bytes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.rounds))
