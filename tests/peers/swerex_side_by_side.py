"""Our steps next to SWE-ReX's, side by side in one run, on the same base image (issue 36's step-cost
goals). A standalone script, not a pytest test (pytest collects only ``test_*.py``).

    python3 -m venv /tmp/swerex-venv && /tmp/swerex-venv/bin/pip install 'swe-rex==1.4.0' aiohttp
    .venv/bin/python tests/peers/swerex_side_by_side.py [--swerex-python /tmp/swerex-venv/bin/python]
        [--rounds 3] [--reads 200] [--execs 100] [--cold 2] [--remove-image]

(``--make-venv`` makes that venv itself when ``--swerex-python`` does not exist; the env var
``SWEREX_PYTHON`` is the default for ``--swerex-python``.) swe-rex 1.4.0 imports aiohttp in
``swerex.runtime.remote`` without declaring it, hence the second package.

How it is split: this script runs in the project's venv (softprobe-gym, the Docker SDK) and never
imports swerex. The SWE-ReX client side runs in a subprocess of the swe-rex venv: the same file
with ``--swerex-worker``, which imports only the standard library and swerex, and answers one
JSON line per request on its stdin/stdout (start a server container, read, exec, cold starts,
stop). Each side times its own client calls in its own process (``time.perf_counter`` around
``await host.step(...)`` here, around ``await runtime.read_file(...)`` there); while one side
measures, the other waits on a pipe.

What is compared, each round in a rotated order (ours over attach, ours over the direct socket,
SWE-ReX), ``--rounds`` interleaved rounds, p50 of all the rounds' samples:

1. ``fs.read`` of a 200-byte seed file (``small.txt`` in ``/workspace``) vs SWE-ReX's
   ``read_file`` of the same 200 bytes at ``/workspace/small.txt`` in its container;
2. ``shell.exec`` of ``true`` (our shim runs ``sh -c true`` as the agent's uid, then sweeps) vs
   ``execute(Command(command=["true"]))`` (a plain ``subprocess.run``, no shell);
3. a cold reset (``create_episode`` + ``reset``: a new container with the seed copied in, its shim
   ready) vs a SWE-ReX container start to a server that answers ``is_alive`` (``docker run -d``
   then ``is_alive`` polled every 5 ms; SWE-ReX's own ``DockerDeployment`` polls every 250 ms).

Our two variants are two hosts of this process: one made with ``SOFTPROBE_GYM_CHANNEL=attach``,
one without it (the direct channel); the channel each step took (``diagnostics["channel"]``) is
printed. The SWE-ReX server is ``swerex-remote`` in the peer image ``softprobe-peer/swerex:1.4.0``
(``softprobe/base:latest`` plus ``pip install swe-rex==1.4.0``, built here from local images
only: the machine's CA bundle is copied into the build so pip reaches PyPI), run on the default
bridge network with its port published on 127.0.0.1 only; the client is
``swerex.runtime.remote.RemoteRuntime`` (a new aiohttp session and TCP connection per request,
as SWE-ReX does). The peer image is kept as that tag, a cache (rebuilt when
``softprobe/base:latest`` changes); ``--remove-image`` removes it at the end. Every image and
container made here carries the label ``softprobe.gym.peer=swerex``; every container started is
removed, and so is the temporary folder.

Timings on a 2-core machine are noisy: compare the ratios, never assert them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

SWEREX_VERSION = "1.4.0"
BASE = "softprobe/base:latest"
PEER_IMAGE = f"softprobe-peer/swerex:{SWEREX_VERSION}"
PEER_LABEL = ("softprobe.gym.peer", "swerex")
RUN_LABEL = "softprobe.gym.peer.run"  # this run's containers, for the final sweep
BASE_LABEL = "softprobe.gym.peer.base"  # the image id of softprobe/base the peer image was built on
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CONTENT = "x" * 200
SMALL = "small.txt"
CONTAINER_FILE = "/workspace/small.txt"
SIDES = ("attach", "direct", "swerex")
REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = "/tmp/swerex-venv"


# -- the SWE-ReX side: runs in the swe-rex venv (standard library and swerex only) ---------------

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _docker(*args: str, check: bool = True) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:2])} failed: {done.stderr.strip()}")
    return done.stdout.strip()


class _SwerexWorker:
    """SWE-ReX's client against ``swerex-remote`` in containers of the peer image."""

    def __init__(self, image: str, labels: list[str]) -> None:
        self.image, self.labels = image, labels
        self.started: list[str] = []  # container names, removed by stop() / close()
        self.runtime: Any = None
        self.name: str | None = None

    async def start(self) -> tuple[str, Any, float]:
        from swerex.runtime.remote import RemoteRuntime

        token, port = uuid.uuid4().hex, _free_port()
        name = f"softprobe-peer-swerex-{uuid.uuid4().hex[:12]}"
        label_args = [arg for label in self.labels for arg in ("--label", label)]
        # The command as SWE-ReX's DockerDeployment gives it (less its pipx fallback after `||`).
        cmd = ["run", "-d", "--name", name, *label_args, "-p", f"127.0.0.1:{port}:8000", self.image,
               "/bin/sh", "-c", f"swerex-remote --auth-token {token}"]
        self.started.append(name)
        started = time.perf_counter()
        _docker(*cmd)
        runtime = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token)
        while not await runtime.is_alive(timeout=1.0):
            if time.perf_counter() - started > 60:
                raise TimeoutError(f"swerex-remote in {name} did not answer in 60 s: {_docker('logs', name, check=False)}")
            await asyncio.sleep(0.005)
        return name, runtime, time.perf_counter() - started

    def remove(self, name: str) -> None:
        _docker("rm", "-f", "-v", name, check=False)
        if name in self.started:
            self.started.remove(name)

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        from swerex.runtime.abstract import Command, ReadFileRequest, WriteFileRequest

        op, n = request["op"], int(request.get("n", 0))
        if op == "hello":
            import swerex

            return {"version": swerex.__version__}
        if op == "start":
            self.name, self.runtime, seconds = await self.start()
            await self.runtime.write_file(WriteFileRequest(path=CONTAINER_FILE, content=CONTENT))
            version = (await self.runtime.execute(Command(command=["swerex-remote", "--version"]))).stdout.strip()
            return {"name": self.name, "start_s": seconds, "server_version": version}
        if op == "read":
            times = []
            for _ in range(n):
                began = time.perf_counter()
                read = await self.runtime.read_file(ReadFileRequest(path=CONTAINER_FILE))
                times.append(time.perf_counter() - began)
                if read.content != CONTENT:
                    raise RuntimeError(f"read_file returned {read.content[:40]!r}")
            return {"times": times}
        if op == "exec":
            times = []
            for _ in range(n):
                began = time.perf_counter()
                done = await self.runtime.execute(Command(command=["true"]))
                times.append(time.perf_counter() - began)
                if done.exit_code != 0:
                    raise RuntimeError(f"true exited {done.exit_code}")
            return {"times": times}
        if op == "cold":
            times = []
            for _ in range(n):
                name, runtime, seconds = await self.start()
                times.append(seconds)
                await runtime.close()
                self.remove(name)
            return {"times": times}
        if op == "stop":
            if self.runtime is not None:
                await self.runtime.close()
                self.runtime = None
            if self.name is not None:
                self.remove(self.name)
                self.name = None
            return {}
        raise ValueError(f"unknown op {op!r}")

    def close(self) -> None:
        for name in list(self.started):
            self.remove(name)


def worker_main(image: str, labels: list[str]) -> None:
    """Answer one JSON line per request line. The protocol has its own copy of stdout: stdout
    itself goes to stderr, since SWE-ReX's client prints there (``_handle_transfer_exception``)."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    worker = _SwerexWorker(image, labels)

    async def serve() -> None:
        for line in sys.stdin:
            try:
                reply = await worker.handle(json.loads(line))
            except Exception as exc:  # sent to the parent, which raises it
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            protocol.write(json.dumps(reply) + "\n")

    try:
        asyncio.run(serve())
    finally:
        worker.close()


# -- our side, and the run: the project's venv -----------------------------------------------------

class SwerexClient:
    """The worker subprocess, called from a thread so this process's event loop keeps running."""

    def __init__(self, python: str, image: str, run_id: str) -> None:
        labels = ["=".join(PEER_LABEL), f"{RUN_LABEL}={run_id}"]
        cmd = [python, str(Path(__file__).resolve()), "--swerex-worker", "--image", image,
               *[arg for label in labels for arg in ("--label", label)]]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lock = threading.Lock()

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self.lock:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the SWE-ReX worker ended (exit {self.proc.poll()}); its stderr is above")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"SWE-ReX worker, {request['op']}: {reply['error']}")
        return reply

    async def call(self, op: str, n: int = 0) -> dict[str, Any]:
        return await asyncio.to_thread(self._call, {"op": op, "n": n})

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the worker removes its containers as it ends
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ensure_peer_image(*, rebuild: bool) -> tuple[str, bool]:
    """The peer image (built when missing, when built on another softprobe/base, or with
    ``rebuild``); returns its id and whether it was built now."""
    base_id = _docker("image", "inspect", BASE, "--format", "{{.Id}}")
    current = _docker("image", "inspect", PEER_IMAGE, "--format", "{{.Id}} {{index .Config.Labels \"" + BASE_LABEL + "\"}}",
                      check=False).split()
    if not rebuild and len(current) == 2 and current[1] == base_id:
        return current[0], False
    print(f"building {PEER_IMAGE} on {BASE} ({base_id[7:19]}) ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="swerex-peer-build-") as ctx:
        shutil.copy(CA_BUNDLE, Path(ctx) / "ca.crt")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", ctx, "pip"],
                       check=True)
        wheel = next(Path(ctx).glob("pip-*.whl")).name
        # The base image has python3 but no pip: pip's own wheel runs as a zip application.
        (Path(ctx) / "Dockerfile").write_text(f"""FROM {BASE}
USER root
COPY ca.crt {wheel} /tmp/peer-build/
RUN PIP_CERT=/tmp/peer-build/ca.crt REQUESTS_CA_BUNDLE=/tmp/peer-build/ca.crt SSL_CERT_FILE=/tmp/peer-build/ca.crt \\
    PIP_DEFAULT_TIMEOUT=120 PIP_DISABLE_PIP_VERSION_CHECK=1 \\
    python3 /tmp/peer-build/{wheel}/pip install --no-cache-dir --break-system-packages 'swe-rex=={SWEREX_VERSION}' \\
    && rm -rf /tmp/peer-build && swerex-remote --version
USER 1000:1000
""")
        # softprobe.gym.image is inherited from the base ("base"): say what this one is.
        subprocess.run(["docker", "build", "-q", "--force-rm", "--label", "=".join(PEER_LABEL),
                        "--label", "softprobe.gym.image=peer-swerex",
                        "--label", f"{BASE_LABEL}={base_id}", "-t", PEER_IMAGE, ctx], check=True, stdout=subprocess.DEVNULL)
    new_id = _docker("image", "inspect", PEER_IMAGE, "--format", "{{.Id}}")
    if current and current[0] != new_id:  # the tag moved: the older peer image is ours to remove
        _docker("rmi", current[0], check=False)
    return new_id, True


READ = {"type": "tool", "name": "fs.read", "args": {"path": SMALL}}
TRUE = {"type": "tool", "name": "shell.exec", "args": {"command": "true"}}


class Ours:
    """One host of ours (one channel), with a long-lived episode for the steps."""

    def __init__(self, name: str, host: Any) -> None:
        self.name, self.host, self.channels = name, host, set()
        self.episode = f"steps-{name}"
        self.cold_count = 0

    async def steps(self, action: dict[str, Any], n: int) -> list[float]:
        times = []
        for _ in range(n):
            began = time.perf_counter()
            result = await self.host.step(episode_id=self.episode, action=action)
            times.append(time.perf_counter() - began)
            if result.error is not None:
                raise RuntimeError(f"{self.name}: {action['name']} failed: {result.error}")
            self.channels.add(result.diagnostics.get("channel"))
        return times

    async def cold(self, n: int) -> list[float]:
        times = []
        for _ in range(n):
            self.cold_count += 1
            episode = f"cold-{self.name}-{self.cold_count}"
            began = time.perf_counter()
            await self.host.create_episode(episode_id=episode)
            await self.host.reset(episode_id=episode)
            times.append(time.perf_counter() - began)
            await self.host.destroy(episode_id=episode, cleanup=True)
        return times


async def open_ours(name: str, tmp: Path, seed: Path, stack: contextlib.AsyncExitStack) -> Ours:
    from softprobe.gym import create_host_environment
    from softprobe.gym.providers.docker.direct_channel import CHANNEL_ENV

    saved = os.environ.pop(CHANNEL_ENV, None)
    if name == "attach":
        os.environ[CHANNEL_ENV] = "attach"
    try:  # the provider reads the variable when the host is made
        host = await stack.enter_async_context(
            create_host_environment(run_root=tmp / f"run-{name}", seed_root=seed, image=BASE))
    finally:
        os.environ.pop(CHANNEL_ENV, None)
        if saved is not None:
            os.environ[CHANNEL_ENV] = saved
    ours = Ours(name, host)
    await host.create_episode(episode_id=ours.episode)
    first = await host.reset(episode_id=ours.episode)
    assert SMALL in str(first.observation), first.observation
    probe = await host.step(episode_id=ours.episode, action=READ)
    assert probe.observation == CONTENT, probe.observation
    return ours


def p50_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def fmt(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.2f} ms"


def channel_folders() -> set[str]:
    """The direct channel's folders (``softprobe-channel-*``) in this machine's temp folder."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "softprobe-channel-*")))


async def run(args: argparse.Namespace) -> str:
    run_id = uuid.uuid4().hex[:12]
    folders_before = channel_folders()
    image_id, built = ensure_peer_image(rebuild=args.rebuild_image)
    samples: dict[str, dict[str, list[float]]] = {m: {s: [] for s in SIDES} for m in ("read", "exec", "cold")}
    per_round: dict[str, dict[str, list[float]]] = {m: {s: [] for s in SIDES} for m in ("read", "exec", "cold")}
    swerex = SwerexClient(args.swerex_python, PEER_IMAGE, run_id)
    info: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="swerex-side-by-side-") as tmp_name:
            tmp = Path(tmp_name)
            seed = tmp / "seed"
            seed.mkdir()
            (seed / SMALL).write_text(CONTENT)
            async with contextlib.AsyncExitStack() as stack:
                info["swerex_client"] = (await swerex.call("hello"))["version"]
                ours = {name: await open_ours(name, tmp, seed, stack) for name in ("attach", "direct")}
                started = await swerex.call("start")
                info["swerex_server"] = started["server_version"]
                # Warm-up, untimed: the first calls of each side pay for imports and caches.
                for side in ours.values():
                    await side.steps(READ, 20)
                    await side.steps(TRUE, 10)
                await swerex.call("read", 20)
                await swerex.call("exec", 10)

                async def measure(kind: str, side: str) -> list[float]:
                    n = {"read": args.reads, "exec": args.execs, "cold": args.cold}[kind]
                    if side == "swerex":
                        return list((await swerex.call(kind, n))["times"])
                    if kind == "cold":
                        return await ours[side].cold(n)
                    return await ours[side].steps(READ if kind == "read" else TRUE, n)

                for r in range(args.rounds):
                    order = SIDES[r % 3:] + SIDES[:r % 3]
                    print(f"round {r + 1}/{args.rounds}: {', '.join(order)}", file=sys.stderr)
                    for kind in ("read", "exec", "cold"):
                        if kind == "cold" and not args.cold:
                            continue
                        for side in order:
                            times = await measure(kind, side)
                            samples[kind][side] += times
                            per_round[kind][side].append(p50_ms(times))
                await swerex.call("stop")
                info["channels"] = {name: sorted(str(c) for c in side.channels) for name, side in ours.items()}
    finally:
        swerex.close()
        leftover = _docker("ps", "-aq", "--filter", f"label={RUN_LABEL}={run_id}", check=False).split()
        for container in leftover:
            _docker("rm", "-f", "-v", container, check=False)
        if args.remove_image:
            _docker("rmi", PEER_IMAGE, check=False)
    info["leftover"] = len(leftover)
    # Our hosts remove each container's channel folder with it; one still here was made during
    # this run (by these hosts, or by another process of the machine).
    info["folders"] = sorted(channel_folders() - folders_before)
    return report(args, samples, per_round, info, image_id, built)


def report(args: argparse.Namespace, samples: dict[str, dict[str, list[float]]],
           per_round: dict[str, dict[str, list[float]]], info: dict[str, Any], image_id: str, built: bool) -> str:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    base_id = _docker("image", "inspect", BASE, "--format", "{{.Id}}", check=False)
    titles = {"read": f"fs.read 200 B vs read_file (N={args.reads} x {args.rounds})",
              "exec": f"shell.exec true vs execute([\"true\"]) (N={args.execs} x {args.rounds})",
              "cold": f"cold reset vs container start to is_alive (N={args.cold} x {args.rounds})"}
    header = ["measurement", "ours attach p50", "ours direct p50", "SWE-ReX p50", "SWE-ReX/ours-direct"]
    rows = []
    for kind, title in titles.items():
        if not samples[kind]["swerex"]:
            continue
        p = {side: p50_ms(samples[kind][side]) for side in SIDES}
        rows.append([title, fmt(p["attach"]), fmt(p["direct"]), fmt(p["swerex"]), f"{p['swerex'] / p['direct']:.2f}x"])
    lines = [
        f"SWE-ReX side by side, {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, on {os.uname().nodename} "
        f"({os.cpu_count()} cores, load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end)",
        f"softprobe-gym {commit}; swe-rex {info.get('swerex_client')} (client) / {info.get('swerex_server')} (server, "
        f"{PEER_IMAGE} {image_id[7:19]}{', built now' if built else ', cached'}); base {BASE} {base_id[7:19]}",
        f"our steps' channels: attach host {info['channels']['attach']}, direct host {info['channels']['direct']}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        "each round's p50 (ms), in round order:",
    ]
    for kind in titles:
        if samples[kind]["swerex"]:
            lines.append(f"  {kind:5} " + "; ".join(
                f"{side} " + " / ".join(f"{ms:.2f}" for ms in per_round[kind][side]) for side in SIDES))
    lines.append(f"containers left by this run: {info['leftover']}; channel folders made during the run and still "
                 f"there: {len(info['folders'])}{' ' + ', '.join(info['folders']) if info['folders'] else ''}; peer image "
                 + ("removed" if args.remove_image else f"kept as {PEER_IMAGE} (a cache; --remove-image removes it)"))
    return "\n".join(lines)


def make_venv(path: str) -> None:
    venv = Path(path).parents[1]
    print(f"making {venv} with swe-rex=={SWEREX_VERSION} ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"swe-rex=={SWEREX_VERSION}", "aiohttp"], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--swerex-python", default=os.environ.get("SWEREX_PYTHON", f"{DEFAULT_VENV}/bin/python"),
                        help="a python with swe-rex (and aiohttp) installed (env SWEREX_PYTHON)")
    parser.add_argument("--make-venv", action="store_true", help="make that venv when it does not exist")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--execs", type=int, default=100)
    parser.add_argument("--cold", type=int, default=2, help="cold starts per side per round (0: none)")
    parser.add_argument("--rebuild-image", action="store_true")
    parser.add_argument("--remove-image", action="store_true", help=f"remove {PEER_IMAGE} at the end")
    parser.add_argument("--prepare", action="store_true", help="only make the venv (with --make-venv) and the peer image")
    parser.add_argument("--swerex-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--image", default=PEER_IMAGE, help=argparse.SUPPRESS)
    parser.add_argument("--label", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.swerex_worker:
        worker_main(args.image, args.label)
        return 0
    if not Path(args.swerex_python).exists():
        if not args.make_venv:
            parser.error(f"{args.swerex_python} does not exist: make the venv (see the top of this file) or pass --make-venv")
        make_venv(args.swerex_python)
    if args.prepare:
        image_id, built = ensure_peer_image(rebuild=args.rebuild_image)
        print(f"{PEER_IMAGE} {image_id[7:19]} ({'built now' if built else 'cached'})")
        return 0
    print(asyncio.run(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
