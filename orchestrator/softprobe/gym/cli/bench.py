"""``softprobe-gym bench``: our operations next to the raw Docker operation doing the same work.

Each pair is measured interleaved in one run (ours, then raw, then ours...), so that whatever
else the machine does affects both sides alike. Rows:

- a step (``fs.read`` of 200 B) vs ``docker exec cat``; ``shell.exec true`` vs ``docker exec true``;
- a cold reset vs ``docker create`` + ``put_archive`` + ``start``; a warm reset (from the pool);
  both again with the billing world's service vs one container;
- a checkpoint vs ``docker commit``; forks by prefix re-execution (N=1, 10) and checkpoint import;
- K episodes stepping at once (K = 1, 8, 32, 64): steps/s, vs the same call sent bare to the same
  containers (what the host's bookkeeping costs) and vs bare ``exists`` round trips (the channel
  alone: what the host and the shim's call cost together);
- the same on a sharded host (``SHARDED_WORKERS`` worker processes), vs raw shim round trips
  run inside its workers;
- a step with tracing on (OpenTelemetry, spans recorded and dropped) vs off, interleaved;
- a step after a one-file change in a 10,000-file workspace vs the same in an empty one;
- memory of an idle episode (its container and the host's share);
- a full support-desk training rollout, end to end;
- workspace-scope checkpoints of a 1 MB workspace (all new, and after a 1-file change) and their
  import vs the container-scope ones; ``fork_many(8)`` vs one fork (checkpoint import and
  prefix re-execution).

Ratios, not absolute times, are what carry from one machine to another.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from pydantic import BaseModel

from softprobe.gym import labels as L
from softprobe.gym.cli.bench_cpu import CpuRow, cpu_ratios, format_cpu, run_cpu_bench
from softprobe.gym.episodes.factory import create_host_environment
from softprobe.gym.episodes.host import HostEnvironment
from softprobe.gym.errors import ConfigurationError
from softprobe.gym.providers.archive import build_seed_archive
from softprobe.gym.providers.docker.baseline import DockerBaseline
from softprobe.gym.providers.docker.direct_channel import CHANNEL_ENV
from softprobe.gym.providers.docker.images import images_dir
from softprobe.gym.providers.docker.provider import DockerProvider
from softprobe.gym.runtime import Runtime
from softprobe.gym.settings import RUNTIME_ENV, ContainerSettings
from softprobe.gym.tracing import discarding_provider, use_tracer_provider
from softprobe.gym.worlds import ServiceSpec

if TYPE_CHECKING:
    from softprobe.gym.training.rewards import RewardContext
    from softprobe.gym.training.session import TrainingSession


class BenchRow(BaseModel):
    """One measurement: ours next to the baseline, and their ratio.

    ``ratio`` is baseline / ours for times (above 1: we are faster) and ours / baseline for
    rates (above 1: we do more per second); ``ratio_meaning`` says which.
    """

    name: str
    unit: str
    ours_p50: float
    ours_p99: float | None = None
    baseline: str | None = None
    baseline_p50: float | None = None
    baseline_p99: float | None = None
    ratio: float | None = None
    ratio_meaning: str | None = None
    samples: int


class BenchReport(BaseModel):
    """A bench run: the CPU-per-step rows (the headline; see :mod:`.bench_cpu`) and the timed rows."""

    image: str
    quick: bool
    rows: list[BenchRow]
    cpu: list[CpuRow] = []
    cpu_ratios: dict[str, float] = {}


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _time_row(name: str, baseline: str | None, ours: list[float], raw: list[float] | None) -> BenchRow:
    ours_p50 = statistics.median(ours)
    row = BenchRow(name=name, unit="ms", ours_p50=round(ours_p50 * 1000, 3),
                   ours_p99=round(_p(ours, 0.99) * 1000, 3), samples=len(ours))
    if raw:
        raw_p50 = statistics.median(raw)
        row.baseline = baseline
        row.baseline_p50 = round(raw_p50 * 1000, 3)
        row.baseline_p99 = round(_p(raw, 0.99) * 1000, 3)
        row.ratio = round(raw_p50 / ours_p50, 2)
        row.ratio_meaning = "baseline/ours: >1 means faster"
    return row


async def _timed(func: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await func()
    return time.perf_counter() - started


class _NoSubject:
    """Lets the bench declare subject_state_import, so checkpoint_import can be measured."""

    def export_state(self, episode_id: str) -> None:
        return None

    def import_state(self, episode_id: str, state: object) -> None:
        return None


READ = {"type": "tool", "name": "fs.read", "args": {"path": "small.txt"}}
TRUE = {"type": "tool", "name": "shell.exec", "args": {"command": "true"}}


class _Sizes(TypedDict):
    """How much each measurement does (``--quick`` or not)."""

    steps: int
    execs: int
    resets: int
    forks: int
    concurrency: tuple[int, ...]  # episodes stepping at once, one row each


async def run_bench(*, image: str, quick: bool = False, cpu_only: bool = False,
                    log: Callable[[str], None] = lambda _: None) -> BenchReport:
    """Run every measurement (only the CPU-per-step rows with ``cpu_only``); leaves no
    container, image or folder behind."""
    n: _Sizes = {"steps": 200, "execs": 20, "resets": 6, "forks": 3, "concurrency": (1, 8)} if quick else {
        "steps": 1000, "execs": 100, "resets": 25, "forks": 5, "concurrency": (1, 8, 32, 64)}
    rows: list[BenchRow] = []
    with tempfile.TemporaryDirectory(prefix="softprobe-bench-") as tmp:
        seed = Path(tmp) / "seed"
        seed.mkdir()
        (seed / "small.txt").write_text("x" * 200)
        cpu = await run_cpu_bench(image=image, seed=seed, run_root=Path(tmp) / "cpu", quick=quick, log=log)
        if cpu_only:
            return BenchReport(image=image, quick=quick, rows=[], cpu=cpu, cpu_ratios=cpu_ratios(cpu))
        async with create_host_environment(
            run_root=Path(tmp) / "run", seed_root=seed, image=image, pool_size=2,
            capabilities={"subject_state_import": True}, subject=_NoSubject(),
        ) as host:
            baseline = DockerBaseline(host.provider)
            await host.warm_up()
            log("steps")
            rows += await _steps(host, baseline, n)
            log("resets")
            rows += await _resets(host, baseline, seed, n)
            log("checkpoints and forks")
            rows += await _checkpoints_and_forks(host, baseline, n)
        log("tracing")
        rows += await _tracing_overhead(image, Path(tmp), seed, n["steps"])
        log("worlds with a service")
        rows += await _world_resets(image, Path(tmp), seed, n)
        log("concurrency")
        rows += await _concurrency(image, Path(tmp), seed, n["concurrency"], quick)
        log("sharded host")
        rows += await _sharded_concurrency(image, Path(tmp), seed, n["concurrency"], quick)
        log("large workspace")
        rows += await _large_workspace(image, Path(tmp))
        log("memory and a full rollout")
        rows += await _memory_and_rollout(image, Path(tmp), seed)
        log("workspace checkpoints and group forks")
        rows += await _fast_forks(image, Path(tmp), n)
    return BenchReport(image=image, quick=quick, rows=rows, cpu=cpu, cpu_ratios=cpu_ratios(cpu))


def _sandbox(host: HostEnvironment, episode_id: str) -> Runtime:
    runtime = host.runtime_of(episode_id=episode_id)
    assert runtime is not None
    return runtime


async def _steps(host: HostEnvironment, baseline: DockerBaseline, n: _Sizes) -> list[BenchRow]:
    await host.create_episode(episode_id="bench")
    await host.reset(episode_id="bench")
    container = _sandbox(host, "bench").sandbox_id
    for _ in range(20):
        await host.step(episode_id="bench", action=READ)
    ours, raw = [], []
    for i in range(n["steps"]):
        ours.append(await _timed(lambda: host.step(episode_id="bench", action=READ)))
        if i < n["execs"]:
            raw.append(await _timed(lambda: baseline.exec(container, ["cat", "/workspace/small.txt"])))
    rows = [_time_row("step fs.read (200 B file)", "docker exec cat", ours, raw)]
    ours, raw = [], []
    for _ in range(n["execs"]):
        ours.append(await _timed(lambda: host.step(episode_id="bench", action=TRUE)))
        raw.append(await _timed(lambda: baseline.exec(container, ["true"])))
    rows.append(_time_row("step shell.exec true", "docker exec true", ours, raw))
    # The floor under any step: a bare protocol round trip to the same shim.
    shim = _sandbox(host, "bench")
    floor = [await _timed(lambda: shim.exists("small.txt")) for _ in range(n["steps"])]
    ours = [await _timed(lambda: host.step(episode_id="bench", action=READ)) for _ in range(n["steps"])]
    row = _time_row("step overhead over a bare shim round trip", "shim round trip", ours, floor)
    row.ratio, row.ratio_meaning = round(row.ours_p50 - (row.baseline_p50 or 0), 3), "ours - baseline (ms added)"
    rows.append(row)
    return rows


async def _resets(host: HostEnvironment, baseline: DockerBaseline, seed: Path, n: _Sizes) -> list[BenchRow]:
    image_id = _sandbox(host, "bench").image_id
    archive = build_seed_archive(seed, uid=1000, gid=1000)
    settings = host.config.container
    ours, raw = [], []
    # Cold: a host of the same configuration without a warm pool, side by side with raw Docker.
    async with create_host_environment(
        run_root=host.run_root / "cold", seed_root=seed, image=host.image, container=settings
    ) as cold:
        await cold.create_episode(episode_id="cold")
        for _ in range(n["resets"]):
            ours.append(await _timed(lambda: cold.reset(episode_id="cold")))
            started = time.perf_counter()
            container = await baseline.start(image_id, archive, settings, {L.HOST: host.host_id})
            raw.append(time.perf_counter() - started)
            await baseline.remove(container)
    rows = [_time_row("reset, cold (new container + seed)", "docker create+put_archive+start", ours, raw)]
    warm = []
    for _ in range(n["resets"]):
        assert host.pool is not None
        await host.pool.wait_ready()
        warm.append(await _timed(lambda: host.reset(episode_id="bench")))
    rows.append(_time_row("reset, warm (from the pool)", "docker create+put_archive+start", warm, raw))
    return rows


async def _tracing_overhead(image: str, tmp: Path, seed: Path, steps: int) -> list[BenchRow]:
    """A step on a host that traces (every span recorded, then dropped) next to one on a host
    that does not, interleaved; none without opentelemetry-sdk."""
    provider = discarding_provider()
    if provider is None:
        return []
    async with contextlib.AsyncExitStack() as stack:
        hosts = []
        for name, traced in (("off", False), ("on", True)):
            use_tracer_provider(provider if traced else False)
            try:
                host = create_host_environment(run_root=tmp / f"tracing-{name}", seed_root=seed, image=image)
            finally:
                use_tracer_provider(None)
            hosts.append(await stack.enter_async_context(host))
            await host.create_episode(episode_id="bench")
            await host.reset(episode_id="bench")
        off, on = hosts
        times: dict[str, list[float]] = {"off": [], "on": []}
        for i in range(steps + 20):  # the first 20 of each warm up; who goes first alternates
            for name, host in (("off", off), ("on", on)) if i % 2 else (("on", on), ("off", off)):
                took = await _timed(lambda: host.step(episode_id="bench", action=READ))  # noqa: B023
                if i >= 20:
                    times[name].append(took)
    provider.shutdown()
    row = _time_row("step fs.read with tracing on", "the same step, tracing off", times["on"], times["off"])
    row.ratio = round(statistics.median(times["on"]) / statistics.median(times["off"]), 3)
    row.ratio_meaning = "on/off: the cost of tracing (1.0 = none)"
    return [row]


def billing_services() -> tuple[ServiceSpec, ...]:
    """The services of the shipped billing world (``images/support-desk-billing``), loaded from
    its bundle, so the world rows time the world that ships.

    Raises:
        BundleError: the bundle is invalid. ImageBuildError: no ``images/`` folder is found.
    """
    from softprobe.gym.bundles import load_bundle

    return load_bundle(images_dir() / "support-desk-billing").world.services


async def _world_resets(image: str, tmp: Path, seed: Path, n: _Sizes) -> list[BenchRow]:
    """Resets of a world of agent + the billing world's service against the single-container
    world, cold and warm, alternating so both see the same machine."""
    rows = []
    services = billing_services()
    for label, pool_size in (("cold", 0), ("warm", 2)):
        async with create_host_environment(
            run_root=tmp / f"world-{label}", seed_root=seed, image=image, pool_size=pool_size,
            services=services,
        ) as world, create_host_environment(
            run_root=tmp / f"single-{label}", seed_root=seed, image=image, pool_size=pool_size,
        ) as single:
            ours: list[float] = []
            raw: list[float] = []
            for host in (world, single):
                await host.create_episode(episode_id="bench")
                await host.warm_up()
            for _ in range(n["resets"]):
                for host, times in ((world, ours), (single, raw)):
                    if host.pool is not None:
                        await host.pool.wait_ready()
                    times.append(await _timed(functools.partial(host.reset, episode_id="bench")))
            served = f"{len(services)} service" + ("s" if len(services) > 1 else "")
            rows.append(_time_row(f"reset, {label}, agent + {served} (billing)", f"reset, {label}, one container",
                                  ours, raw))
    return rows


async def _checkpoints_and_forks(host: HostEnvironment, baseline: DockerBaseline, n: _Sizes) -> list[BenchRow]:
    write = {"type": "tool", "name": "fs.write", "args": {"path": "n.txt", "content": "1"}}
    await host.step(episode_id="bench", action=write)
    ours, raw = [], []
    for _ in range(n["resets"]):
        ours.append(await _timed(lambda: host.checkpoint(episode_id="bench")))
        started = time.perf_counter()
        committed = await baseline.commit(_sandbox(host, "bench").sandbox_id)
        raw.append(time.perf_counter() - started)
        await baseline.remove_image(committed)
    rows = [_time_row("checkpoint", "docker commit (no pause)", ours, raw)]
    for i in range(10):
        await host.step(episode_id="bench", action={**write, "args": {"path": f"f{i}", "content": str(i)}})
    ckpt = await host.checkpoint(episode_id="bench")
    forks: list[tuple[str, dict[str, Any]]] = [
        ("fork, prefix re-execution N=1", dict(path="prefix_reexecution", prefix_length=1)),
        ("fork, prefix re-execution N=10", dict(path="prefix_reexecution", prefix_length=10)),
        ("fork, checkpoint import", dict(path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)),
    ]
    for name, kwargs in forks:
        times = []
        for _ in range(n["forks"]):
            assert host.pool is not None
            await host.pool.wait_ready()
            started = time.perf_counter()
            child = await host.fork(episode_id="bench", **kwargs)
            times.append(time.perf_counter() - started)
            await host.destroy(episode_id=child.episode_id, cleanup=True)
        rows.append(_time_row(name, None, times, None))
    return rows


async def _concurrency(image: str, tmp: Path, seed: Path, ks: tuple[int, ...], quick: bool) -> list[BenchRow]:
    steps_each = 100 if quick else 200
    rows: list[BenchRow] = []
    for k in ks:
        rows += await _concurrency_rows(image, tmp, seed, k, steps_each)
    return rows


async def _concurrency_rows(image: str, tmp: Path, seed: Path, k: int, steps_each: int) -> list[BenchRow]:
    """K episodes stepping at once, against two floors on the same containers, interleaved in
    two rounds: the same ``fs.read`` call sent bare (the shim's work, not the host's
    bookkeeping) and an ``exists`` round trip (the channel alone)."""
    async with create_host_environment(run_root=tmp / f"k{k}", seed_root=seed, image=image) as host:
        names = [f"k{k}-{i}" for i in range(k)]
        await asyncio.gather(*(host.create_episode(episode_id=name) for name in names))
        await asyncio.gather(*(host.reset(episode_id=name) for name in names))
        latencies: list[float] = []
        args: dict[str, Any] = {"path": "small.txt"}  # READ's
        cap = host.config.output_cap_bytes

        async def ours(name: str) -> None:
            for _ in range(steps_each):
                latencies.append(await _timed(lambda: host.step(episode_id=name, action=READ)))

        async def same_call(name: str) -> None:
            shim = _sandbox(host, name)
            for _ in range(steps_each):
                await shim.call_tool(tool="fs.read", args=args, timeout_s=30.0, output_cap=cap)

        async def channel(name: str) -> None:
            shim = _sandbox(host, name)
            for _ in range(steps_each):
                await shim.exists("small.txt")

        walls: dict[str, float] = {"ours": 0.0, "call": 0.0, "exists": 0.0}
        runs: dict[str, Callable[[str], Awaitable[None]]] = {"ours": ours, "call": same_call, "exists": channel}
        for _round in range(2):
            for key, run in runs.items():
                walls[key] += await _timed(functools.partial(_all_at_once, run, names))
    total = 2 * k * steps_each
    ours_rate, call_rate, exists_rate = (total / walls[key] for key in ("ours", "call", "exists"))
    p99 = round(_p(latencies, 0.99) * 1000, 3)

    def against(name: str, baseline: str, rate: float, meaning: str) -> BenchRow:
        return BenchRow(name=name, unit="steps/s", ours_p50=round(ours_rate), ours_p99=p99, baseline=baseline,
                        baseline_p50=round(rate), ratio=round(ours_rate / rate, 2), ratio_meaning=meaning,
                        samples=total)

    return [
        against(f"{k} episodes stepping at once", "the same call sent bare, same containers", call_rate,
                "ours/baseline rate: what the host's bookkeeping costs (p99 column: our step latency in ms)"),
        against(f"{k} episodes stepping at once (vs exists)", "bare shim round trips (exists), same containers",
                exists_rate, "ours/baseline rate: the host and the shim's call against the channel alone"),
    ]


async def _all_at_once(run: Callable[[str], Awaitable[None]], names: list[str]) -> None:
    await asyncio.gather(*(run(name) for name in names))


SHARDED_WORKERS = 2


async def _sharded_concurrency(image: str, tmp: Path, seed: Path, ks: tuple[int, ...], quick: bool) -> list[BenchRow]:
    """K episodes stepping at once on a host of ``SHARDED_WORKERS`` worker processes, driven from
    this process: steps/s against bare shim round trips run inside the workers on the same
    containers (the floor of that set-up)."""
    steps_each = 100 if quick else 200
    return [await _sharded_row(image, tmp, seed, k, steps_each) for k in ks]


async def _sharded_row(image: str, tmp: Path, seed: Path, k: int, steps_each: int) -> BenchRow:
    from softprobe.gym.scale.sharded import create_sharded_host

    async with create_sharded_host(workers=SHARDED_WORKERS, run_root=tmp / f"sharded-k{k}", seed_root=seed,
                                   image=image) as host:
        names = [f"s{k}-{i}" for i in range(k)]
        await asyncio.gather(*(host.create_episode(episode_id=name) for name in names))
        await asyncio.gather(*(host.reset(episode_id=name) for name in names))
        latencies: list[float] = []

        async def ours(name: str) -> None:
            for _ in range(steps_each):
                latencies.append(await _timed(functools.partial(host.step, episode_id=name, action=READ)))

        await host.bare_round_trips(episode_ids=names, steps=5)  # warm both sides
        wall = await _timed(lambda: asyncio.gather(*(ours(name) for name in names)))
        raw_wall = await host.bare_round_trips(episode_ids=names, steps=steps_each)
    total = k * steps_each
    ours_rate, raw_rate = total / wall, total / raw_wall
    return BenchRow(
        name=f"{k} episodes, sharded host ({SHARDED_WORKERS} workers)", unit="steps/s",
        ours_p50=round(ours_rate), ours_p99=round(_p(latencies, 0.99) * 1000, 3),
        baseline=f"bare round trips in the {SHARDED_WORKERS} workers", baseline_p50=round(raw_rate),
        ratio=round(ours_rate / raw_rate, 2),
        ratio_meaning="ours/baseline rate (p99 column: our step latency in ms)", samples=total,
    )


async def _large_workspace(image: str, tmp: Path) -> list[BenchRow]:
    big = tmp / "big-seed"
    for d in range(100):
        folder = big / f"d{d:02d}"
        folder.mkdir(parents=True)
        for f in range(100):
            (folder / f"f{f:02d}.txt").write_text(f"{d}-{f}\n")
    change = {"type": "tool", "name": "shell.exec", "args": {"command": "echo changed > d07/f07.txt"}}
    empty_change = {"type": "tool", "name": "shell.exec", "args": {"command": "echo changed > one.txt"}}
    results = {}
    for label, seed_root, action in [("big", big, change), ("empty", None, empty_change)]:
        async with create_host_environment(run_root=tmp / f"ws-{label}", seed_root=seed_root, image=image) as host:
            await host.create_episode(episode_id="ws")
            await host.reset(episode_id="ws")
            for _ in range(3):
                await host.step(episode_id="ws", action=action)
            results[label] = await _step_times(host, action, 30)
    row = _time_row("step after a 1-file change, 10,000-file workspace", "same step, empty workspace",
                    results["big"], results["empty"])
    row.ratio = round(statistics.median(results["big"]) / statistics.median(results["empty"]), 2)
    row.ratio_meaning = "ours/baseline: the cost of workspace size (target <= 3)"
    return [row]


async def _step_times(host: HostEnvironment, action: dict[str, Any], n: int) -> list[float]:
    return [await _timed(lambda: host.step(episode_id="ws", action=action)) for _ in range(n)]


def _rss_kib() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


async def _memory_and_rollout(image: str, tmp: Path, seed: Path) -> list[BenchRow]:
    from softprobe.gym.training.session import create_training_session

    k = 8
    rows = []
    async with create_host_environment(run_root=tmp / "mem", seed_root=seed, image=image) as host:
        baseline = DockerBaseline(host.provider)
        names = [f"m{i}" for i in range(k)]
        await host.create_episode(episode_id="m-warm")
        await host.reset(episode_id="m-warm")
        before = _rss_kib()
        for name in names:
            await host.create_episode(episode_id=name)
            await host.reset(episode_id=name)
        host_share = (_rss_kib() - before) / k / 1024

        per_container = [await baseline.memory_mb(_sandbox(host, name).sandbox_id) for name in names]
        total = statistics.median(per_container) + host_share
        rows.append(BenchRow(name=f"memory of an idle episode (median of {k})", unit="MB", ours_p50=round(total, 2),
                             baseline="container working set + host share",
                             baseline_p50=round(statistics.median(per_container), 2),
                             ratio=round(host_share, 2), ratio_meaning="host share of the total (MB)", samples=k))
    if image.endswith("support-desk:latest"):
        async def has_note(ctx: Any) -> dict[str, Any]:
            return {"workspace_had_note": await ctx.exists("refund-note.md")}

        times = []
        async with create_host_environment(run_root=tmp / "rollout", image=image, on_step=has_note) as host:
            for i in range(5):
                session = create_training_session(host, episode_id=f"r{i}", reward_from=_note_reward)
                times.append(await _timed(functools.partial(_rollout, session)))
        rows.append(_time_row("support-desk training rollout + finalize", None, times, None))
    return rows


def _note_reward(ctx: RewardContext) -> dict[str, Any]:
    return {"checks": [{"name": "note_written", "passed": bool(ctx.step_result.diagnostics.get("workspace_had_note"))}]}


async def _rollout(session: TrainingSession) -> None:
    async for _ in session.rollout([
        {"type": "tool", "name": "crm.get_account", "args": {"id": "A-42"}},
        {"type": "tool", "name": "fs.write", "args": {"path": "refund-note.md"}},
        {"type": "terminate"},
    ]):
        pass
    await session.finalize()


def _prefixed(log: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    return lambda line: log(prefix + line)


def format_report(report: BenchReport) -> str:
    header = f"{'measurement':52} {'unit':8} {'p50':>10} {'p99':>10}   {'baseline':38} {'p50':>10} {'ratio':>8}"
    lines = [f"softprobe-gym bench on {report.image}{' (quick)' if report.quick else ''}"]
    if report.cpu:
        lines += format_cpu(report.cpu)
        lines += [f"  {name}: {ratio:.2f}x" for name, ratio in report.cpu_ratios.items()]
        lines.append("")
    if not report.rows:
        return "\n".join(lines)
    lines += [header, "-" * len(header)]
    for r in report.rows:
        lines.append(
            f"{r.name:52} {r.unit:8} {r.ours_p50:10.3f} {'' if r.ours_p99 is None else f'{r.ours_p99:10.3f}':>10}   "
            f"{r.baseline or '-':38} {'' if r.baseline_p50 is None else f'{r.baseline_p50:10.3f}':>10} "
            f"{'' if r.ratio is None else f'{r.ratio:7.2f}':>8}"
        )
    lines.append("ratio: see each row's ratio_meaning in --json (times: baseline/ours, >1 faster)")
    return "\n".join(lines)


class Comparison(BaseModel):
    """``bench --compare-runtimes`` or ``--compare-channels``: one report per OCI runtime, or per
    channel to the shim (attach, direct), measured in turn in one run."""

    image: str
    quick: bool
    compared: Literal["runtimes", "channels"] = "runtimes"
    reports: dict[str, BenchReport]


def format_comparison(comparison: Comparison) -> str:
    names = list(comparison.reports)
    header = f"{'measurement (p50)':52} {'unit':8}" + "".join(f" {name:>22}" for name in names)
    lines = [f"softprobe-gym bench on {comparison.image}, {comparison.compared} side by side"]
    lines += _cpu_comparison(comparison)
    if not comparison.reports[names[0]].rows:
        return "\n".join(lines)
    lines += [header, "-" * len(header)]
    by_runtime = {name: {row.name: row for row in report.rows} for name, report in comparison.reports.items()}
    for row in comparison.reports[names[0]].rows:
        cells = []
        for name in names:
            other = by_runtime[name].get(row.name)
            cells.append(f" {'-' if other is None else f'{other.ours_p50:.3f}':>22}")
        lines.append(f"{row.name:52} {row.unit:8}" + "".join(cells))
    return "\n".join(lines)


def _cpu_comparison(comparison: Comparison) -> list[str]:
    """CPU per step (total us) and wall ms per step of each CPU row under each runtime (or
    channel), and each one's over the first's."""
    names = list(comparison.reports)
    first = comparison.reports[names[0]].cpu
    if not first:
        return []
    header = f"{'CPU per step: total us / wall ms':44} {'k':>2}" + "".join(f" {name:>18}" for name in names)
    header += "".join(f" {name + '/' + names[0]:>16}" for name in names[1:])
    lines = [header, "-" * len(header)]
    by_runtime = {name: {(row.name, row.episodes): row for row in report.cpu} for name, report in
                  comparison.reports.items()}
    for row in first:
        cells, ratios = "", ""
        for name in names:
            other = by_runtime[name].get((row.name, row.episodes))
            total = None if other is None else other.cpu_us.get("total")
            cells += f" {'-' if other is None else f'{total or 0:.0f} / {other.wall_ms:.2f}':>18}"
            if name != names[0]:
                ratio = "-" if other is None or not row.wall_ms else f"{other.wall_ms / row.wall_ms:.2f}x wall"
                ratios += f" {ratio:>16}"
        lines.append(f"{row.name:44} {row.episodes:>2}" + cells + ratios)
    lines.append("")
    return lines


def main_bench(*, image: str, quick: bool, as_json: bool, runtimes: list[str] | None = None,
               cpu_only: bool = False, compare_channels: bool = False) -> int:
    """Run the bench (under each of ``runtimes`` in turn, or over each channel to the shim with
    ``compare_channels``; only the CPU-per-step rows with ``cpu_only``) and print the report.

    Raises:
        ConfigurationError: a runtime the engine does not have; channels to compare where the
            direct one cannot be used (the message says why).
    """
    import sys

    def log(stage: str) -> None:
        print(f"bench: {stage} ...", file=sys.stderr)

    if not runtimes and not compare_channels:
        report = asyncio.run(run_bench(image=image, quick=quick, cpu_only=cpu_only, log=log))
        print(report.model_dump_json(indent=2) if as_json else format_report(report))
        return 0
    provider = DockerProvider(direct_channel=True)
    try:  # refuse what cannot be measured before measuring anything
        if compare_channels:
            problem = provider.channel_problem(ContainerSettings())
            if problem is not None:
                raise ConfigurationError(f"--compare-channels needs the direct channel, and here {problem}")
        for runtime in runtimes or []:
            provider.check_settings(ContainerSettings(runtime=runtime))
    finally:
        provider.discard()
    if compare_channels:  # by the SOFTPROBE_GYM_CHANNEL value that picks each
        variants = {"attach": (CHANNEL_ENV, "attach"), "direct": (CHANNEL_ENV, "direct")}
    else:
        variants = {runtime: (RUNTIME_ENV, runtime) for runtime in runtimes or []}
    reports = {}
    for name, (variable, value) in variants.items():
        with _environment(variable, value):  # every host the bench makes defaults to it
            reports[name] = asyncio.run(run_bench(image=image, quick=quick, cpu_only=cpu_only,
                                                  log=_prefixed(log, f"{name}: ")))
    comparison = Comparison(image=image, quick=quick, reports=reports,
                            compared="channels" if compare_channels else "runtimes")
    print(comparison.model_dump_json(indent=2) if as_json else format_comparison(comparison))
    return 0


@contextlib.contextmanager
def _environment(variable: str, value: str) -> Iterator[None]:
    """``variable`` set to ``value`` meanwhile, then as it was."""
    saved = os.environ.get(variable)
    os.environ[variable] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = saved


async def _fast_forks(image: str, tmp: Path, n: _Sizes) -> list[BenchRow]:
    """Workspace checkpoints against full-container ones on a 1 MB workspace (take, and import
    into a warm pooled container), and a group of 8 forks against one fork (issue 21)."""
    seed = tmp / "mb-seed"
    seed.mkdir()
    for i in range(16):  # 16 files of 64 KiB
        (seed / f"data-{i:02d}.bin").write_bytes(os.urandom(64 * 1024))
    samples = max(3, n["forks"])
    timings: dict[str, dict[str, list[float]]] = {}
    for scope in ("workspace", "container"):
        caps = {"subject_state_import": True, "checkpoint_scope": scope}
        async with create_host_environment(run_root=tmp / f"ff-{scope}", seed_root=seed, image=image, pool_size=8,
                                           capabilities=caps, subject=_NoSubject()) as host:
            assert host.pool is not None
            await host.warm_up()
            got: dict[str, list[float]] = {"first": [], "checkpoint": [], "import": [], "one": [], "eight": [],
                                           "prefix one": [], "prefix eight": []}
            for i in range(samples):  # a first checkpoint: all of the 1 MB is new
                await host.create_episode(episode_id=f"first-{i}")
                await host.reset(episode_id=f"first-{i}")
                started = time.perf_counter()
                await host.checkpoint(episode_id=f"first-{i}")
                got["first"].append(time.perf_counter() - started)
                await host.destroy(episode_id=f"first-{i}", cleanup=True)
            await host.create_episode(episode_id="ff")
            await host.reset(episode_id="ff")
            ckpt = await host.checkpoint(episode_id="ff")
            for i in range(samples):  # after a one-file change (the usual case between branch points)
                await host.step(episode_id="ff", action={"type": "tool", "name": "fs.write",
                                                         "args": {"path": f"n{i}.txt", "content": str(i)}})
                started = time.perf_counter()
                ckpt = await host.checkpoint(episode_id="ff")
                got["checkpoint"].append(time.perf_counter() - started)
            forks: list[tuple[str, int, dict[str, Any]]] = [
                ("import", 1, dict(path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)),
                ("one", 1, dict(path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)),
                ("eight", 8, dict(path="checkpoint_import", checkpoint_id=ckpt.checkpoint_id)),
                ("prefix one", 1, dict(path="prefix_reexecution", prefix_length=1)),
                ("prefix eight", 8, dict(path="prefix_reexecution", prefix_length=1)),
            ]
            for key, count, kwargs in forks:
                if scope == "container" and key not in ("import",):
                    continue
                for _ in range(samples):
                    await host.pool.wait_ready()
                    started = time.perf_counter()
                    children = await host.fork_many(episode_id="ff", n=count, **kwargs)
                    got[key].append(time.perf_counter() - started)
                    await asyncio.gather(*(host.destroy(episode_id=c.episode_id, cleanup=True) for c in children))
            timings[scope] = got
    ws, full = timings["workspace"], timings["container"]
    rows = [
        _time_row("checkpoint, workspace scope, 1 MB all new", "checkpoint, container scope (docker commit)",
                  ws["first"], full["first"]),
        _time_row("checkpoint, workspace scope, 1 MB after a 1-file change", "checkpoint, container scope",
                  ws["checkpoint"], full["checkpoint"]),
        _time_row("fork, workspace checkpoint import (1 MB, warm pool)", "fork, container checkpoint import",
                  ws["import"], full["import"]),
    ]
    for name, eight, one in [("fork_many(8), workspace checkpoint import", ws["eight"], ws["one"]),
                             ("fork_many(8), prefix re-execution N=1", ws["prefix eight"], ws["prefix one"])]:
        row = _time_row(name, "fork(1), same path", eight, one)
        row.ratio = round(statistics.median(eight) / statistics.median(one), 2)
        row.ratio_meaning = "ours/baseline: 8 children against one (target <= 2)"
        rows.append(row)
    return rows
