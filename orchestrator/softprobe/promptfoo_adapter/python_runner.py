"""Runs ``python`` assertions in a child interpreter, as promptfoo does.

Inline code becomes the body of ``main(output, context)`` (a one-line value is ``return``-ed);
``file://path.py[:function]`` calls ``function`` (default ``get_assert``) in that file. The child
prints its return value as JSON; an exception, a timeout or a value that is not JSON is a
:class:`ScriptError` (the assertion FAILS).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from .jsvalues import json_parse

TIMEOUT_S = 60.0

_CHILD = r"""
import importlib.util, json, sys, traceback
request = json.loads(sys.stdin.read())
try:
    if "path" in request:
        spec = importlib.util.spec_from_file_location("softprobe_assertion", request["path"])
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, request["dir"])
        spec.loader.exec_module(module)
        function = getattr(module, request["function"])
    else:
        namespace = {"__name__": "softprobe_assertion"}
        exec(compile(request["script"], "<assertion>", "exec"), namespace)
        function = namespace["main"]
    result = function(*request["args"])
    sys.stdout.write("\x00RESULT" + json.dumps({"ok": True, "result": result}))
except BaseException as err:
    sys.stdout.write("\x00RESULT" + json.dumps({"ok": False, "error": f"{type(err).__name__}: {err}"}))
"""


class ScriptError(Exception):
    """The assertion's code failed; the message says how."""


def build_script(code: str) -> str:
    """promptfoo's ``buildPythonScript``: wrap assertion code as ``main(output, context)``."""
    if "\n" in code:
        match = re.search(r"^(?!\s*$)\s+", code, re.M)
        indent = match.group(0) if match else "    "
        body = "\n".join(indent + line for line in code.split("\n"))
    else:
        body = f"    return {code}"
    return f"import json\n\ndef main(output, context):\n{body}\n"


def run_inline(code: str, args: list[Any]) -> Any:
    return _run({"script": build_script(code), "args": args})


def run_file(reference: str, args: list[Any]) -> Any:
    path, _, function = reference.partition(":")
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise ScriptError(f"file not found: {resolved}")
    return _run(
        {"path": str(resolved), "dir": str(resolved.parent), "function": function or "get_assert", "args": args}
    )


def _run(request: dict[str, Any]) -> Any:
    python = os.environ.get("PROMPTFOO_PYTHON") or sys.executable
    try:
        done = subprocess.run(
            [python, "-c", _CHILD],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise ScriptError(f"the assertion did not finish within {TIMEOUT_S:g}s") from None
    except OSError as err:
        raise ScriptError(f"cannot start {python}: {err.strerror}") from None
    marker = done.stdout.rfind("\x00RESULT")
    if marker < 0:
        raise ScriptError(f"python exited with code {done.returncode}: {done.stderr.strip()[-500:]}")
    text = done.stdout[marker + len("\x00RESULT") :]
    try:  # promptfoo reads the result with JSON.parse: NaN and Infinity are not JSON there
        answer = json_parse(text)
    except ValueError as err:
        raise ScriptError(f"Error running Python script: Invalid JSON returned by Python script: {err}") from None
    if not answer["ok"]:
        raise ScriptError(answer["error"])
    return answer["result"]
