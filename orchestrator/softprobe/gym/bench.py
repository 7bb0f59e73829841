"""``softprobe-gym bench``: our operations next to the raw Docker operation doing the same work.

Measured: an fs.read step vs ``docker exec cat``; a shell.exec step vs ``docker exec true``; a
cold reset vs create + put_archive + start; a checkpoint vs ``docker commit``; forks (prefix
re-execution of 1 and 10 steps, checkpoint import) next to the create + copy + start floor.

Each pair is measured interleaved in one loop (ours, then raw, then ours...), so that whatever
else the machine does affects both sides alike. Reported: median and p99 of each side and the
speedup (raw median / our median; above 1 means we are faster).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

from pydantic import BaseModel

from . import labels as L
from .host import HostEnvironment, create_host_environment
from .sandbox.base import Sandbox
from .sandbox.archive import build_seed_archive
from .sandbox.docker_backend import DockerBackend, _host_config_kwargs
from .settings import ContainerSettings


class BenchRow(BaseModel):
    name: str
    ours_p50_ms: float
    ours_p99_ms: float
    baseline: str
    baseline_p50_ms: float
    baseline_p99_ms: float
    speedup: float
    samples: int


class BenchReport(BaseModel):
    image: str
    rows: list[BenchRow]


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _row(name: str, baseline: str, ours: list[float], raw: list[float]) -> BenchRow:
    ours_p50, raw_p50 = statistics.median(ours), statistics.median(raw)
    return BenchRow(
        name=name,
        ours_p50_ms=round(ours_p50 * 1000, 3),
        ours_p99_ms=round(_p(ours, 0.99) * 1000, 3),
        baseline=baseline,
        baseline_p50_ms=round(raw_p50 * 1000, 3),
        baseline_p99_ms=round(_p(raw, 0.99) * 1000, 3),
        speedup=round(raw_p50 / ours_p50, 2),
        samples=len(ours),
    )


async def _timed(func: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await func()
    return time.perf_counter() - started


async def run_bench(*, image: str, quick: bool = False) -> BenchReport:
    """Measure steps, resets, checkpoints and forks against raw Docker; leaves nothing behind."""
    steps, execs, resets = (200, 30, 8) if quick else (1000, 100, 30)
    rows = []
    with tempfile.TemporaryDirectory(prefix="softprobe-bench-") as tmp:
        seed = Path(tmp) / "seed"
        seed.mkdir()
        (seed / "small.txt").write_text("x" * 200)
        async with create_host_environment(
            run_root=Path(tmp) / "run",
            seed_root=seed,
            image=image,
            capabilities={"subject_state_import": True},
            subject=_NoSubject(),
        ) as host:
            backend: DockerBackend = host._backend  # type: ignore[assignment]
            await host.create_episode(episode_id="bench")
            await host.reset(episode_id="bench")
            sandbox = host._episodes["bench"].sandbox
            assert sandbox is not None
            api = backend.client.api
            read = {"type": "tool", "name": "fs.read", "args": {"path": "small.txt"}}
            true = {"type": "tool", "name": "shell.exec", "args": {"command": "true"}}

            async def raw_exec(cmd: list[str]) -> None:
                def run() -> None:
                    exec_id = api.exec_create(sandbox.sandbox_id, cmd)["Id"]
                    api.exec_start(exec_id)

                await backend._run(run)

            for _ in range(20):  # warm up both paths
                await host.step(episode_id="bench", action=read)
            await raw_exec(["cat", "/workspace/small.txt"])

            ours, raw = [], []
            for i in range(steps):
                ours.append(await _timed(lambda: host.step(episode_id="bench", action=read)))
                if i < execs:
                    raw.append(await _timed(lambda: raw_exec(["cat", "/workspace/small.txt"])))
            rows.append(_row("step fs.read (200 B file)", "docker exec cat", ours, raw))

            ours, raw = [], []
            for _ in range(execs):
                ours.append(await _timed(lambda: host.step(episode_id="bench", action=true)))
                raw.append(await _timed(lambda: raw_exec(["true"])))
            rows.append(_row("step shell.exec true", "docker exec true", ours, raw))

            archive = build_seed_archive(seed, uid=1000, gid=1000)
            image_id = sandbox.image_id
            host_config = api.create_host_config(**_host_config_kwargs(ContainerSettings()))

            async def raw_reset() -> None:
                def run() -> None:
                    container = api.create_container(
                        image_id,
                        command=["sleep", "infinity"],
                        user="1000:1000",
                        host_config=host_config,
                        labels={L.MANAGED: "true", L.OWNER: L.current_owner(), L.HOST: host.host_id},
                    )["Id"]
                    api.put_archive(container, "/", archive)
                    api.start(container)
                    raw_ids.append(container)

                await backend._run(run)

            raw_ids: list[str] = []
            ours, raw = [], []
            for _ in range(resets):
                ours.append(await _timed(lambda: host.reset(episode_id="bench")))
                raw.append(await _timed(raw_reset))
                await backend._run(backend._remove, raw_ids.pop())
            rows.append(_row("reset (cold: new container + seed)", "docker create+put_archive+start", ours, raw))

            # Checkpoints: ours (commit + labels + record) vs a raw commit of the same container.
            write = {"type": "tool", "name": "fs.write", "args": {"path": "n.txt", "content": "1"}}
            await host.step(episode_id="bench", action=write)
            ours, raw = [], []
            for _ in range(resets):
                ours.append(await _timed(lambda: host.checkpoint(episode_id="bench")))
                started = time.perf_counter()
                committed = await backend._run(
                    api.commit, sandbox_now(host).sandbox_id, conf={"Labels": {L.MANAGED: "true"}}, pause=False
                )
                raw.append(time.perf_counter() - started)
                await backend.remove_image(committed["Id"])
            rows.append(_row("checkpoint", "docker commit (no pause)", ours, raw))

            # Forks of a 10-step parent, next to the raw floor of any new container.
            for i in range(10):
                await host.step(episode_id="bench", action={**write, "args": {"path": f"f{i}", "content": str(i)}})
            ckpt = await host.checkpoint(episode_id="bench")
            cases = [
                ("fork prefix_reexecution N=1", dict(path="prefix_reexecution", prefix_length=1)),
                ("fork prefix_reexecution N=10", dict(path="prefix_reexecution", prefix_length=10)),
                ("fork checkpoint_import", dict(path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)),
            ]
            for name, kwargs in cases:
                ours, raw = [], []
                for _ in range(max(3, resets // 3)):
                    started = time.perf_counter()
                    child = await host.fork(episode_id="bench", **kwargs)  # type: ignore[arg-type]
                    ours.append(time.perf_counter() - started)
                    await host.destroy(episode_id=child.episode_id, cleanup=True)
                    raw.append(await _timed(raw_reset))
                    await backend._run(backend._remove, raw_ids.pop())
                rows.append(_row(name, "docker create+put_archive+start", ours, raw))
    return BenchReport(image=image, rows=rows)


def sandbox_now(host: HostEnvironment) -> Sandbox:
    sandbox = host._episodes["bench"].sandbox
    assert sandbox is not None
    return sandbox


class _NoSubject:
    """Lets the bench declare subject_state_import, so checkpoint_import can be measured."""

    def export_state(self, episode_id: str) -> None:
        return None

    def import_state(self, episode_id: str, state: object) -> None:
        return None


def format_report(report: BenchReport) -> str:
    header = f"{'measurement':38} {'p50 ms':>9} {'p99 ms':>9}   {'baseline':32} {'p50 ms':>9} {'p99 ms':>9} {'speedup':>8}"
    lines = [f"softprobe-gym bench on {report.image}", header, "-" * len(header)]
    for r in report.rows:
        lines.append(
            f"{r.name:38} {r.ours_p50_ms:9.3f} {r.ours_p99_ms:9.3f}   {r.baseline:32} "
            f"{r.baseline_p50_ms:9.3f} {r.baseline_p99_ms:9.3f} {r.speedup:7.2f}x"
        )
    lines.append("speedup = baseline p50 / ours p50 (above 1: softprobe-gym is faster)")
    return "\n".join(lines)


def main_bench(*, image: str, quick: bool, as_json: bool) -> int:
    report = asyncio.run(run_bench(image=image, quick=quick))
    print(report.model_dump_json(indent=2) if as_json else format_report(report))
    return 0
