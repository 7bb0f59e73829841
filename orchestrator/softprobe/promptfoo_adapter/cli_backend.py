"""The CLI backend: grade with the real ``promptfoo`` CLI, offline, many rollouts in one run.

Each rollout becomes one test of one config: its final output goes in ``providerOutput`` (used
verbatim, never templated), the provider is ``echo`` with the prompt ``{{ '' }}`` (so an empty
output still grades), and the ids ride in ``metadata``. Assertion strings are templated by
promptfoo, so any Nunjucks syntax in them is wrapped in ``{% raw %}`` to stay literal.

Nothing leaves the machine: telemetry, updates and sharing are off, the config dir is private to
the run, and HTTP(S) proxies point at a closed loopback port for the one request promptfoo still
attempts.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .errors import PromptfooCliError, PromptfooConfigRejectedError
from .models import Assertion, EvalCase

DEFAULT_TIMEOUT_S = 300.0
# Errors that mean the machine ran out of something, not that promptfoo is broken.
EXHAUSTED_ERRNOS = frozenset({errno.ENOMEM, errno.ENOSPC, errno.EMFILE, errno.ENFILE, errno.EAGAIN, errno.EDQUOT})
_TEMPLATE_MARKERS = ("{{", "{%", "{#")
# What promptfoo prints when it refuses the config as a whole (before grading any test).
_CONFIG_REJECTIONS = ("AssertValidationError", "MissingPointerError", "EMISSINGPOINTER", "ResolverError",
                      "Invalid assertion at")


def find_cli() -> list[str] | None:
    """The command that runs promptfoo: ``$SOFTPROBE_PROMPTFOO`` or ``promptfoo`` on PATH."""
    configured = os.environ.get("SOFTPROBE_PROMPTFOO")
    if configured:
        return [configured] if Path(configured).exists() or shutil.which(configured) else None
    found = shutil.which("promptfoo")
    return [found] if found else None


def literal(text: str) -> str:
    """``text`` as a Nunjucks template that renders to exactly ``text``."""
    if not any(marker in text for marker in _TEMPLATE_MARKERS):
        return text
    pieces = text.split("{% endraw %}")
    return "{{ '{% endraw %}' }}".join(f"{{% raw %}}{piece}{{% endraw %}}" for piece in pieces)


def _escape_value(value: Any) -> Any:
    if isinstance(value, str):
        return literal(value)
    if isinstance(value, list):
        return [literal(v) if isinstance(v, str) else v for v in value]
    return value


def _assertion_config(assertion: Assertion, base: Path) -> dict[str, Any]:
    data = assertion.to_config()
    value = data.get("value")
    if isinstance(value, str) and value.startswith("file://"):
        path, sep, function = value[len("file://"):].partition(":")
        data["value"] = "file://" + str((base / path).resolve()) + (sep + function if sep else "")
    elif assertion.type != "python":
        data["value"] = _escape_value(value)
    elif isinstance(value, str):
        data["value"] = literal(value)  # promptfoo renders python code as a template too
    if data.get("metric"):
        data["metric"] = literal(data["metric"])
    if assertion.assert_ is not None:
        data["assert"] = [_assertion_config(child, base) for child in assertion.assert_]
    if "value" in data and data["value"] is None and "value" not in assertion.model_fields_set:
        del data["value"]
    return data


def _offline_env(home: Path) -> dict[str, str]:
    proxy = f"http://127.0.0.1:{_closed_port()}"
    return {
        **os.environ,
        "PROMPTFOO_CONFIG_DIR": str(home),
        "PROMPTFOO_DISABLE_TELEMETRY": "1",
        "PROMPTFOO_DISABLE_UPDATE": "1",
        "PROMPTFOO_DISABLE_SHARING": "1",
        "PROMPTFOO_PYTHON": os.environ.get("PROMPTFOO_PYTHON", sys.executable),
        "HTTPS_PROXY": proxy,
        "HTTP_PROXY": proxy,
        "https_proxy": proxy,
        "http_proxy": proxy,
        "NO_PROXY": "",
        "no_proxy": "",
    }


def cli_version() -> str | None:
    """``promptfoo --version`` of the installed CLI (asked once per command), or None if absent."""
    command = find_cli()
    return _version(tuple(command)) if command else None


@functools.lru_cache(maxsize=8)
def _version(command: tuple[str, ...]) -> str | None:
    with tempfile.TemporaryDirectory(prefix="softprobe-promptfoo-") as tmp:
        try:
            done = subprocess.run([*command, "--version"], cwd=tmp, env=_offline_env(Path(tmp) / "home"),
                                  capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
    lines = done.stdout.strip().splitlines()
    return lines[-1].strip() if done.returncode == 0 and lines else None


def build_config(cases: list[EvalCase], *, base: Path) -> dict[str, Any]:
    tests = []
    for case in cases:
        test: dict[str, Any] = {
            "description": literal(case.attempt_id),
            "providerOutput": case.final_output,
            "metadata": {
                "attemptId": case.attempt_id,
                "trajectoryDigest": case.trajectory_digest,
                "sourceTraceId": case.source_trace_id,
            },
            "assert": [_assertion_config(a, base) for a in case.assertions],
        }
        if case.threshold is not None:
            test["threshold"] = case.threshold
        tests.append(test)
    return {
        "description": "softprobe-gym grading",
        "prompts": ["{{ '' }}"],
        "providers": ["echo"],
        "tests": tests,
    }


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # promptfoo's own children (python assertions) too
    except ProcessLookupError:
        pass


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def run_cli(cases: list[EvalCase], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Grade ``cases`` in one ``promptfoo eval`` run; returns what promptfoo wrote (``-o out.json``).

    Test ``i`` of the run is ``cases[i]``; :func:`rows_by_case` finds each one's row.

    Raises:
        PromptfooCliError: the CLI is missing (``status`` ``runner_error``), did not finish within
            ``timeout_s`` (``timed_out``), could not start for want of resources
            (``resource_exhausted``), or failed (``runner_error``; the message has its stderr).
    """
    command = find_cli()
    if command is None:
        raise PromptfooCliError(
            "the promptfoo CLI is not installed: `npm install -g promptfoo@0.121` (Node 20), or "
            "set SOFTPROBE_PROMPTFOO to its path; or grade with backend='native'"
        )
    if not cases:
        return {}
    with tempfile.TemporaryDirectory(prefix="softprobe-promptfoo-") as tmp:
        work = Path(tmp)
        config_path, output_path = work / "promptfooconfig.json", work / "results.json"
        try:
            config_path.write_text(json.dumps(build_config(cases, base=Path.cwd()), ensure_ascii=False))
        except OSError as err:
            status = "resource_exhausted" if err.errno in EXHAUSTED_ERRNOS else "runner_error"
            raise PromptfooCliError(f"cannot write the promptfoo config: {err.strerror}", status=status) from None
        env = _offline_env(work / "promptfoo-home")
        args = [*command, "eval", "-c", str(config_path), "-o", str(output_path),
                "--no-cache", "--no-progress-bar", "--no-table", "--no-share"]
        try:
            process = await asyncio.create_subprocess_exec(
                *args, cwd=tmp, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True,
            )
        except OSError as err:
            exhausted = err.errno in EXHAUSTED_ERRNOS
            raise PromptfooCliError(
                f"cannot run {command[0]}: {err.strerror}"
                + ("; free some memory, processes or disk and grade again" if exhausted else ""),
                status="resource_exhausted" if exhausted else "runner_error",
            ) from None
        # Read both streams in their own tasks, so that what was said survives a timeout.
        assert process.stdout is not None and process.stderr is not None  # both are PIPEs
        readers = asyncio.gather(process.stdout.read(), process.stderr.read())
        try:
            await asyncio.wait_for(process.wait(), timeout_s)
        except asyncio.TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            _, stderr = await asyncio.wait_for(readers, 10)
            raise PromptfooCliError(
                f"promptfoo eval did not finish within {timeout_s:g}s; grade fewer rollouts at once or "
                "raise the timeout", stderr.decode("utf-8", "replace"), status="timed_out",
            ) from None
        except BaseException:  # cancelled: leave no promptfoo behind
            _kill_group(process.pid)
            raise
        stdout, stderr = await readers
        said = (stderr + stdout).decode("utf-8", "replace")
        if process.returncode not in (0, 100) or not output_path.exists():
            rejection = config_rejection(said)
            if rejection:
                raise PromptfooConfigRejectedError(f"promptfoo rejected the config: {rejection}", said)
            raise PromptfooCliError(f"promptfoo eval failed with exit code {process.returncode}", said)
        try:
            report = json.loads(output_path.read_text())
        except ValueError:
            raise PromptfooCliError("promptfoo wrote results that are not JSON", said) from None
    if not isinstance(report, dict):
        raise PromptfooCliError("promptfoo wrote results that are not a JSON object")
    return report


def config_rejection(stderr: str) -> str | None:
    """The line of promptfoo's stderr that says it refused the config as a whole, if it did."""
    lines = [line.strip() for line in stderr.splitlines()]
    for index, line in enumerate(lines):
        if line.startswith(tuple(f"{name}:" for name in _CONFIG_REJECTIONS)):
            detail = lines[index + 1] if line.endswith(":") and index + 1 < len(lines) else ""
            return f"{line} {detail}".strip()
    for line in lines:
        if any(sign in line for sign in _CONFIG_REJECTIONS) and not line.startswith(("at ", "throw ")):
            index = lines.index(line)
            detail = next((nxt for nxt in lines[index + 1:index + 3] if nxt and not nxt.startswith("at ")), "")
            return f"{line} {detail}".strip() if line.endswith(":") else line
    return None


def config_problem(case: EvalCase) -> str | None:
    """Why promptfoo would refuse a config holding ``case`` as a whole (or None): a nested
    ``assert-set``, or a ``$ref`` in an assertion value (promptfoo dereferences the whole config,
    and a schema's ``#/definitions/...`` does not point into it)."""
    for index, assertion in enumerate(case.assertions):
        if has_ref(assertion.value):
            return f"assert[{index}] has a $ref in its value"
        for j, child in enumerate(assertion.assert_ or []):
            if child.type == "assert-set":
                return f"assert[{index}].assert[{j}] is an assert-set inside an assert-set"
            if has_ref(child.value):
                return f"assert[{index}].assert[{j}] has a $ref in its value"
    return None


def has_ref(value: Any) -> bool:
    """Whether a JSON value holds an object with a ``$ref`` key (at any depth)."""
    if isinstance(value, dict):
        return "$ref" in value or any(has_ref(v) for v in value.values())
    if isinstance(value, list):
        return any(has_ref(v) for v in value)
    return False


def rows_by_case(report: dict[str, Any], cases: list[EvalCase]) -> list[dict[str, Any] | None]:
    """Each case's row of promptfoo's output (matched by ``testIdx``; the order is not
    guaranteed), or None for a case promptfoo returned no row for (e.g. one whose score was not
    a finite number: promptfoo drops that result)."""
    rows = (report.get("results") or {}).get("results") or []
    by_index = {row.get("testIdx"): row for row in rows if isinstance(row, dict)}
    return [by_index.get(index) for index in range(len(cases))]


def no_result_error(index: int, case: EvalCase) -> PromptfooCliError:
    """The error of a case promptfoo returned no result for, when it ran on its own."""
    return PromptfooCliError(f"promptfoo returned no result for test {index} ({case.attempt_id})")


def row_error_status(message: str) -> str:
    """The result status a promptfoo ERROR row means: a type promptfoo does not know is
    ``unsupported``, a grader it could not reach (no API key, no network) a ``runner_error``,
    anything else a malformed assertion (``invalid_input``)."""
    lowered = message.lower()
    if "unknown assertion type" in lowered:
        return "unsupported"
    if any(sign in lowered for sign in ("api key", "apikey", "econnrefused", "fetch failed", "enotfound", "proxy")):
        return "runner_error"
    return "invalid_input"
