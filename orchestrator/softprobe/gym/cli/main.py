"""The ``softprobe-gym`` command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from softprobe.gym.cli.progress import progress_display
from softprobe.gym.episodes.options import option_help
from softprobe.gym.errors import GymError
from softprobe.gym.settings import RUNTIME_ENV
from softprobe.gym.text import terminal_safe
from softprobe.gym.version import __version__

if TYPE_CHECKING:  # imported where used: the CLI starts without loading every subsystem
    from softprobe.gym.evals.runner import SuiteOutcome
    from softprobe.gym.providers.base import SweepReport


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``softprobe-gym`` console script; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    if getattr(args, "runtime", None):
        # The default of every ContainerSettings this process creates (see RUNTIME_ENV).
        os.environ[RUNTIME_ENV] = args.runtime
    try:
        return int(args.run(args) or 0)
    except GymError as err:
        print(f"softprobe-gym: error: {terminal_safe(err, keep_newlines=True)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("softprobe-gym: interrupted", file=sys.stderr)
        return 130


def _add_runtime(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--runtime",
        metavar="NAME",
        help="OCI runtime of the episode containers, e.g. runsc (gVisor); it must be registered "
        "with the engine (default: $SOFTPROBE_GYM_RUNTIME, else the engine's default)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="softprobe-gym",
        description="Run AI-agent episodes in isolated Docker containers.",
    )
    parser.add_argument("--version", action="version", version=f"softprobe-gym {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run the support-desk story in a fresh episode and print its trajectory",
        description=(
            "Run the docs' support-desk story: create an episode, reset it, look up CRM account "
            "A-42, write refund-note.md, terminate, finalize; print the trajectory and where the "
            "artifacts are. Builds the project's images first if they are missing."
        ),
    )
    demo.add_argument("--image", default="softprobe/support-desk:latest",
                      help=f"{option_help('image')} (default: %(default)s)")
    demo.add_argument(
        "--run-root",
        type=Path,
        default=Path(tempfile.gettempdir()) / "softprobe-gym" / "demo",
        help=f"{option_help('run_root')} (default: %(default)s)",
    )
    _add_mode(demo)
    _add_runtime(demo)
    demo.set_defaults(run=_run_demo)

    gc = commands.add_parser(
        "gc",
        help="remove containers, images and networks left by host processes that are gone",
        description=(
            "Remove every container, checkpoint image and world network labelled by softprobe-gym whose owning "
            "host process on this machine is gone. Resources of live processes and of other "
            "machines are kept unless --all is given. Nothing without softprobe-gym's labels is "
            "ever touched."
        ),
    )
    gc.add_argument("--all", action="store_true", help="remove everything softprobe-gym created, live owners too")
    gc.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    gc.add_argument("--json", action="store_true", help="print the report as JSON")
    gc.set_defaults(run=_run_gc)

    bench = commands.add_parser(
        "bench",
        help="measure steps, resets, checkpoints, forks, throughput and memory next to raw Docker",
        description=(
            "Measure, in one run: first CPU microseconds per step of each process on the path (host, "
            "dockerd, containerd, containerd-shim, the shim, the container's cgroup) for fs.read, "
            "shell.exec true and a declared tool at 1 and 8 episodes, next to the bare floors (raw "
            "docker exec, a bare shim round trip, an in-container spawn of true); then, interleaved: "
            "an fs.read step vs `docker exec cat`, a shell.exec "
            "step vs `docker exec true`, the step overhead over a bare shim round trip, cold and "
            "warm resets vs a raw create + put_archive + start (also with a billing service), a "
            "checkpoint vs `docker commit`, forks (prefix re-execution of 1 and 10 steps, checkpoint "
            "import), a step with tracing on vs off, 1 to 64 episodes stepping at once vs the same "
            "call sent bare and vs bare `exists` round trips, the same on a sharded host of 2 worker "
            "processes, a step in a 10,000-file workspace vs an empty one, the memory of an idle "
            "episode, a full support-desk rollout, workspace-scope checkpoints and their import vs "
            "the container-scope ones, and fork_many(8) vs one fork. Prints median, "
            "p99, the baseline and the ratio; cleans up after itself."
        ),
    )
    bench.add_argument("--image", default="softprobe/support-desk:latest",
                       help="image to measure on (default: %(default)s)")
    bench.add_argument("--quick", action="store_true", help="fewer samples (well under a minute)")
    bench.add_argument("--json", action="store_true", help="print the report as JSON")
    bench.add_argument("--cpu", action="store_true",
                       help="only the CPU-per-step rows (each process on the path, at 1 and 8 episodes, next to "
                       "the bare floors; they lead every full run too)")
    compare = bench.add_mutually_exclusive_group()
    compare.add_argument(
        "--compare-runtimes",
        metavar="A,B",
        help="measure under each of these OCI runtimes in turn (e.g. runc,runsc) and print them "
        "side by side; each row's raw Docker baseline runs under the same runtime",
    )
    compare.add_argument(
        "--compare-channels", action="store_true",
        help="measure with the host speaking to each shim over Docker's attach relay, then over the "
        "direct unix socket (local Linux engines, not gVisor), and print them side by side",
    )
    _add_runtime(bench)
    bench.set_defaults(run=_run_bench)

    grade = commands.add_parser(
        "grade",
        help="grade the finished episodes under a run root with Promptfoo assertions",
        description=(
            "Grade every finished episode under RUN_DIR/episodes/ (those with a result.json) with "
            "the assertions in ASSERTIONS.yaml: a list of promptfoo assertions, or a mapping with "
            "'assert: [...]' and an optional 'threshold'. All rollouts go through one grading run. "
            "Each episode folder gets framework-result.json (the softprobe.framework-result/v1 "
            "envelope: result status, digests, findings, trace links) and, when a grader ran, "
            "promptfoo.native.json (promptfoo's own result JSON). A rollout that cannot be graded "
            "gets a status (invalid_input, missing_evidence, unsupported, runner_error, timed_out, "
            "resource_exhausted, cancelled, subject_error) and no score, and the rest are still "
            "graded: a rollout that stopped on an error (rollout.json: terminated_reason error, or "
            "a broken container) and an episode whose records cannot be read are subject_error. "
            "Exit code 0 when all pass, 1 when some fail or err on their own "
            "(invalid_input, missing_evidence, subject_error), 2 on a usage error or when the "
            "grader could not grade some (unsupported, runner_error, timed_out, resource_exhausted, "
            "cancelled)."
        ),
    )
    grade.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run root (the host's run_root)")
    grade.add_argument("--assert", dest="assertions", type=Path, required=True, metavar="ASSERTIONS.yaml")
    grade.add_argument("--backend", choices=["auto", "native", "cli"], default="auto", help="default: %(default)s")
    grade.add_argument("--json", action="store_true",
                       help="print one JSON line per episode: status, passed, score, reason, artifacts")
    grade.set_defaults(run=_run_grade)

    evaluate = commands.add_parser(
        "eval",
        help="run a suite of tasks, each in its own episode, grade them and write a report",
        description=(
            "Run every task of SUITE.yaml in its own isolated episode (bounded parallelism), "
            "grade the finished rollouts with their promptfoo assertions, and write "
            "results.jsonl, summary.json (with counts per result status) and report.html into "
            "--out, and per task grading/<id>/framework-result.json (the "
            "softprobe.framework-result/v1 envelope) and grading/<id>/promptfoo.native.json "
            "(promptfoo's own result JSON), both linked from the report. A task whose rollout "
            "broke is not graded: its status is subject_error and it has no score. A suite or task "
            "with 'bundle: DIR' runs on that environment bundle's world (its image, seed, tools, "
            "services, network, limits and episode policy replace the suite's image, seed and "
            "limits), is graded with the bundle's assertions too, and records the bundle's digest "
            "in results.jsonl and summary.json (--ray is refused for such suites). With --record every "
            "task records its dependency tape into its episode folder; with --replay RUN_DIR every task "
            "replays the tape it recorded in that earlier run (a task without one is an error before "
            "anything runs), so its world's services are not started; a suite file may also set "
            "tape_mode/tape per suite or task. results.jsonl and summary.json ('tapes') carry each "
            "task's tape mode, tape folder and closure-report run level. Ctrl-C stops launching, "
            "destroys running episodes' containers and writes partial results. Exit code 0 when "
            "all tasks pass, 1 when some fail, error or did not run, 2 on a usage or "
            "infrastructure error, 130 when interrupted."
        ),
    )
    evaluate.add_argument("suite", type=Path, metavar="SUITE.yaml")
    evaluate.add_argument("--out", type=Path, required=True, metavar="DIR", help="output folder")
    evaluate.add_argument("--concurrency", type=int, metavar="N", help="episodes at once (default: the suite's)")
    evaluate.add_argument("--resume", action="store_true", help="skip tasks already finished in DIR")
    evaluate.add_argument("--backend", choices=["auto", "native", "cli"], help="grading backend (default: the suite's)")
    evaluate.add_argument("--ray", metavar="auto|ADDRESS",
                          help="run the episodes across a Ray cluster (needs the ray extra; not with tapes)")
    taping = evaluate.add_mutually_exclusive_group()
    taping.add_argument("--record", action="store_true",
                        help="every task records its dependency tape into its episode folder (runs/episodes/<id>/tape)")
    taping.add_argument("--replay", type=Path, metavar="RUN_DIR",
                        help="every task replays the tape it recorded in RUN_DIR (an earlier --out of --record), "
                        "without its world's services; --out must be another folder")
    _add_runtime(evaluate)
    evaluate.set_defaults(run=_run_eval)

    from softprobe.gym.cli.bundle import add_bundle_commands
    from softprobe.gym.cli.compare import add_compare_command
    from softprobe.gym.cli.harbor import add_harbor_commands
    from softprobe.gym.cli.mcp import add_mcp_command
    from softprobe.gym.cli.serve import add_serve_commands
    from softprobe.gym.cli.tape import add_tape_commands
    from softprobe.gym.cli.view import add_view_command

    add_compare_command(commands)
    add_bundle_commands(commands)
    add_tape_commands(commands)
    add_mcp_command(commands)
    add_harbor_commands(commands)
    add_serve_commands(commands)
    add_view_command(commands)

    images = commands.add_parser("images", help="build the project's images")
    image_commands = images.add_subparsers(title="image commands", metavar="COMMAND")
    build = image_commands.add_parser(
        "build",
        help="build softprobe/base and softprobe/support-desk (skips what is up to date)",
        description=(
            "Build softprobe/base:latest and softprobe/support-desk:latest. Idempotent: an image "
            "whose build context, arguments and parent are unchanged is skipped."
        ),
    )
    _add_mode(build)
    build.add_argument("--force", action="store_true", help="rebuild even when up to date")
    build.set_defaults(run=_run_images_build)

    def images_help(_: argparse.Namespace) -> int:
        images.print_help()
        return 2

    images.set_defaults(run=images_help)
    return parser


def _add_mode(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--offline",
        dest="mode",
        action="store_const",
        const="offline",
        help="build the base from a Debian rootfs (debootstrap, needs root) instead of a registry image",
    )
    group.add_argument(
        "--online",
        dest="mode",
        action="store_const",
        const="online",
        help="build the base from python:3.12-slim, pulling it if needed",
    )
    parser.set_defaults(mode="auto")


def _run_images_build(args: argparse.Namespace) -> int:
    from softprobe.gym.providers.docker.images import build_images

    build_images(mode=args.mode, force=args.force)
    return 0


def _run_gc(args: argparse.Namespace) -> int:
    from softprobe.gym.providers.docker.provider import DockerProvider

    async def sweep() -> SweepReport:
        provider = DockerProvider()
        try:
            return await provider.sweep(everything=args.all, dry_run=args.dry_run)
        finally:
            await provider.close()

    report = asyncio.run(sweep())
    if args.json:
        print(report.model_dump_json(indent=2))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    print(
        f"{verb} {len(report.removed_containers)} containers, {len(report.removed_images)} images and "
        f"{len(report.removed_networks)} networks; kept {report.kept_live_owner} of live "
        f"processes and {report.kept_other_host} of other machines"
    )
    return 0


def _run_grade(args: argparse.Namespace) -> int:
    import json

    from softprobe.gym.evals.grading import (
        GRADER_STATUSES,
        case_for,
        finished_episodes,
        format_table,
        grade_traced,
        load_assertions,
    )
    from softprobe.promptfoo_adapter import PromptfooAdapterError

    # Exit 1 means "some rollouts failed", so every error here is a 2.
    try:
        assertions, threshold = load_assertions(args.assertions)
        episodes = finished_episodes(args.run_dir)
        if not episodes:
            raise GymError(f"no finished episodes under {args.run_dir}/episodes")
        cases = [case_for(folder, assertions, threshold) for folder in episodes]
        results = asyncio.run(grade_traced(cases, backend=args.backend))
    except (GymError, PromptfooAdapterError) as err:
        print(f"softprobe-gym: error: {terminal_safe(err, keep_newlines=True)}", file=sys.stderr)
        return 2
    try:
        written = [result.write_artifacts(folder) for folder, result in zip(episodes, results, strict=True)]
    except OSError as err:
        print(f"softprobe-gym: error: cannot write the grading artifacts: {err}", file=sys.stderr)
        return 2
    if args.json:
        for result, paths in zip(results, written, strict=True):
            print(json.dumps({**result.summary(), "artifacts": {k: str(v) for k, v in paths.items()}}))
    else:
        print(format_table(results))
        print(f"each episode folder under {args.run_dir}/episodes now holds framework-result.json "
              "(and promptfoo.native.json when a grader ran)")
    if any(r.status in GRADER_STATUSES for r in results):
        return 2
    return 0 if all(r.passed for r in results) else 1


def _run_eval(args: argparse.Namespace) -> int:
    import signal

    from softprobe.gym.evals.runner import plan_tapes, preflight_suite, run_suite, select_tasks
    from softprobe.gym.evals.suite import SuiteError, load_suite
    from softprobe.promptfoo_adapter import PromptfooAdapterError

    if args.concurrency is not None and args.concurrency < 1:
        print("softprobe-gym: error: --concurrency must be at least 1", file=sys.stderr)
        return 2
    try:
        suite = load_suite(args.suite)
        preflight_suite(suite)  # before anything is written
        if args.replay is not None:  # every task's tape found, before anything is written
            if args.replay.resolve() == args.out.resolve():
                raise SuiteError(f"--replay {args.replay} into the same --out would clear the tapes it replays; "
                                 "write the replay run into another folder")
            plan_tapes(suite, select_tasks(suite), replay_from=args.replay)
    except GymError as err:
        print(f"softprobe-gym: error: {terminal_safe(err, keep_newlines=True)}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)

    async def main() -> SuiteOutcome:
        loop = asyncio.get_running_loop()

        def interrupt() -> None:
            print("softprobe-gym: interrupted: stopping, removing running episodes...", file=sys.stderr)
            loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C quits at once
            inner.cancel()

        with progress_display() as progress:
            inner = asyncio.ensure_future(run_suite(
                suite, args.out, concurrency=args.concurrency, resume=args.resume, backend=args.backend,
                progress=progress,
                ray_address=args.ray, preflight=False,  # done above, before anything was written
                record=args.record, replay_from=args.replay,
            ))
            loop.add_signal_handler(signal.SIGINT, interrupt)
            try:
                return await inner
            finally:
                loop.remove_signal_handler(signal.SIGINT)

    try:
        outcome = asyncio.run(main())
    except (GymError, PromptfooAdapterError) as err:
        print(f"softprobe-gym: error: {terminal_safe(err, keep_newlines=True)}", file=sys.stderr)
        return 2
    summary = outcome.summary
    print(
        f"{summary['passed']}/{summary['ran']} tasks passed ({summary['failed']} failed, "
        f"{summary['errored']} errors) in {summary['wall_s']:.1f} s; report: {args.out / 'report.html'}"
    )
    for taped in summary.get("tapes", []):
        print(f"  {terminal_safe(taped['id'])}: {taped['tape_mode']} {terminal_safe(taped['tape'])} "
              f"(run level {taped['run_level']})")
    if outcome.interrupted:
        return 130
    return 0 if summary["passed"] == summary["planned"] else 1


def _run_bench(args: argparse.Namespace) -> int:
    from softprobe.gym.cli.bench import main_bench
    from softprobe.gym.providers.docker.images import ensure_image

    ensure_image(args.image)
    runtimes = [r.strip() for r in args.compare_runtimes.split(",") if r.strip()] if args.compare_runtimes else None
    return main_bench(image=args.image, quick=args.quick, as_json=args.json, runtimes=runtimes, cpu_only=args.cpu,
                      compare_channels=args.compare_channels)


def _run_demo(args: argparse.Namespace) -> int:
    from softprobe.gym.cli.demo import run_demo
    from softprobe.gym.providers.docker.images import ensure_image

    ensure_image(args.image, mode=args.mode)
    asyncio.run(run_demo(image=args.image, run_root=args.run_root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
