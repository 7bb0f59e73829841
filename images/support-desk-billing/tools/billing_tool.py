"""The support-desk-billing world's billing tools (an overlay: no image build).

    python3 billing_tool.py get_invoice   # stdin {"id": "INV-1001"}
    python3 billing_tool.py refund        # stdin {"invoice_id": ..., "amount_cents": ..., "reason": ...}

Reads its JSON arguments on stdin, calls the billing service (``$BILLING_URL``, default
``http://billing:8080``: the service container, reached by name) and prints its JSON answer.
Anything that goes wrong (the service refuses, cannot be reached, answers nonsense) is one line on
stderr and exit code 1, which the shim reports as a ``tool_failed`` step carrying that line;
malformed arguments are exit code 2. Stdlib only, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_URL = "http://billing:8080"
TIMEOUT_S = 8.0  # below the tools' own 10 s, so a hung service is reported by this script


class ToolFailure(Exception):
    """One line for the agent; ``code`` is the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def call(method: str, path: str, body: Any = None) -> Any:
    """One request to the billing service; its JSON answer.

    Raises:
        ToolFailure: an HTTP error (with the service's own message), no connection, or not JSON.
    """
    base = os.environ.get("BILLING_URL", DEFAULT_URL).rstrip("/")
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    # The service is on the episode's own network: never through a proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=TIMEOUT_S) as response:
            text = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        raise ToolFailure("billing refused (HTTP %d): %s" % (err.code, _error_text(err))) from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise ToolFailure("cannot reach the billing service at %s: %s" % (base, reason)) from None
    try:
        return json.loads(text)
    except ValueError:
        raise ToolFailure("the billing service answered something that is not JSON: %r" % text[:100]) from None


def _error_text(err: urllib.error.HTTPError) -> str:
    try:
        text = err.read().decode("utf-8", "replace")
    except OSError:
        return err.reason if isinstance(err.reason, str) else "no details"
    try:
        payload = json.loads(text)
        message = payload.get("error") if isinstance(payload, dict) else None
    except ValueError:
        message = None
    return " ".join(str(message or text or err.reason).split())[:300]


def get_invoice(args: dict[str, Any]) -> Any:
    """``billing.get_invoice``: one invoice with its refunds and what is still refundable."""
    invoice_id = args.get("id")
    if not isinstance(invoice_id, str) or not invoice_id:
        raise ToolFailure("get_invoice needs an invoice id (a string), e.g. {\"id\": \"INV-1001\"}", 2)
    return call("GET", "/invoices/" + urllib.parse.quote(invoice_id, safe=""))


def refund(args: dict[str, Any]) -> Any:
    """``billing.refund``: refund ``amount_cents`` of a paid invoice, for ``reason``."""
    body = {key: args.get(key) for key in ("invoice_id", "amount_cents", "reason")}
    return call("POST", "/refunds", body)


COMMANDS = {"get_invoice": get_invoice, "refund": refund}


def main(argv: list[str]) -> int:
    try:
        if len(argv) != 2 or argv[1] not in COMMANDS:
            raise ToolFailure("usage: billing_tool.py %s (JSON arguments on stdin)" % "|".join(sorted(COMMANDS)), 2)
        try:
            args = json.loads(sys.stdin.read() or "{}")
        except ValueError as err:
            raise ToolFailure("the arguments on stdin are not JSON: %s" % err, 2) from None
        if not isinstance(args, dict):
            raise ToolFailure("the arguments on stdin must be a JSON object", 2)
        result = COMMANDS[argv[1]](args)
    except ToolFailure as failure:
        sys.stderr.write("%s\n" % failure)
        return failure.code
    json.dump(result, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
