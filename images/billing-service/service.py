"""softprobe/billing-service: the billing API of the ``support-desk-billing`` world.

A small JSON HTTP API (stdlib only; a sidecar container reached by the agent's tools as
``http://billing:8080``):

- ``GET /health``: ``{"status": "ok", "invoices": N}``
- ``GET /invoices``: every invoice; ``GET /invoices/<id>``: one invoice with its refunds and
  ``refundable_cents`` (404 when unknown)
- ``POST /refunds`` ``{"invoice_id", "amount_cents", "reason"}``: a refund record (201); refused
  with a JSON ``{"error": ...}`` when the body is malformed (400), has no length (411) or is over
  4 KiB (413), the invoice is unknown (404), unpaid or the amount exceeds what is still refundable
  (409), or the amount or reason make no sense (422).

State lives in SQLite at ``$BILLING_DB`` (default ``/var/lib/billing/billing.db``), in the
container's own filesystem: a fresh container creates it from the fixture ``invoices.json`` next
to this file, so every new container starts from the same state, and a committed container
(a checkpoint) keeps its own. Records carry no wall-clock time and ids are sequential
(``R-0002``, ...), so replaying the same requests from the same state gives the same answers.

Environment: ``BILLING_PORT`` (default 8080; 0 picks a free port), ``BILLING_HOST`` (default
``0.0.0.0``), ``BILLING_DB``, ``BILLING_FIXTURE``. The first line on stdout is
``billing: listening on HOST:PORT``. SIGTERM stops it at once (it runs as PID 1).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DB = "/var/lib/billing/billing.db"
DEFAULT_FIXTURE = os.path.join(HERE, "invoices.json")
DEFAULT_PORT = 8080
MAX_BODY_BYTES = 4096
MAX_REASON_CHARS = 500
REFUND_FIELDS = {"invoice_id": str, "amount_cents": int, "reason": str}
_INVOICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,31}$")

SCHEMA = """
CREATE TABLE invoices (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL,
    description TEXT NOT NULL,
    amount_cents INTEGER NOT NULL CHECK (amount_cents >= 0),
    currency TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('paid', 'open', 'void'))
);
CREATE TABLE refunds (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    invoice_id TEXT NOT NULL REFERENCES invoices(id),
    amount_cents INTEGER NOT NULL CHECK (amount_cents > 0),
    reason TEXT NOT NULL
);
"""


class BillingError(Exception):
    """A request the API refuses: ``status`` is its HTTP status, the message its ``error``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _money(cents: int) -> str:
    return "%d cents ($%d.%02d)" % (cents, cents // 100, cents % 100)


def create_database(path: str, fixture: str) -> bool:
    """Create the database at ``path`` from ``fixture`` unless it exists already.

    Written to a temporary file and renamed into place, so a start that is interrupted leaves
    either no database or a whole one. Returns whether it was created now.

    Raises:
        RuntimeError: the fixture is unreadable or malformed, or the folder is not writable.
    """
    if os.path.exists(path):
        return False
    try:
        with open(fixture, encoding="utf-8") as f:
            data = json.load(f)
        invoices = [
            (i["id"], i["account_id"], i["description"], int(i["amount_cents"]), i.get("currency", "usd"), i["status"])
            for i in data["invoices"]
        ]
        refunds = [(r["id"], r["invoice_id"], int(r["amount_cents"]), r["reason"]) for r in data.get("refunds", [])]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise RuntimeError("cannot read the billing fixture %s: %s" % (fixture, err)) from None
    folder = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(folder, ".%s.init-%d" % (os.path.basename(path), os.getpid()))
    try:
        os.makedirs(folder, exist_ok=True)
        if os.path.exists(temporary):
            os.unlink(temporary)
        connection = sqlite3.connect(temporary)
        try:
            connection.executescript(SCHEMA)
            connection.executemany("INSERT INTO invoices VALUES (?, ?, ?, ?, ?, ?)", invoices)
            connection.executemany(
                "INSERT INTO refunds (id, invoice_id, amount_cents, reason) VALUES (?, ?, ?, ?)", refunds
            )
            connection.commit()
        finally:
            connection.close()
        os.replace(temporary, path)
    except (OSError, sqlite3.Error) as err:
        raise RuntimeError("cannot create the billing database %s: %s" % (path, err)) from None
    return True


class Billing:
    """The billing state: invoices and refunds in one SQLite file, one request at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("SELECT count(*) FROM invoices JOIN refunds ON 0").fetchone()
        except sqlite3.DatabaseError as err:
            self._db.close()
            raise RuntimeError(
                "%s is not a billing database (%s); remove it to start again from the fixture" % (path, err)
            ) from None

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    def count(self) -> int:
        """How many invoices there are."""
        with self._lock:
            row = self._db.execute("SELECT count(*) FROM invoices").fetchone()
        return int(row[0])

    def invoices(self) -> list[dict[str, Any]]:
        """Every invoice, by id."""
        with self._lock:
            ids = [row[0] for row in self._db.execute("SELECT id FROM invoices ORDER BY id")]
            return [self._invoice(i) for i in ids]

    def invoice(self, invoice_id: str) -> dict[str, Any]:
        """One invoice with its refunds.

        Raises:
            BillingError: 404, no such invoice.
        """
        with self._lock:
            return self._invoice(invoice_id)

    def refund(self, body: Any) -> dict[str, Any]:
        """Refund part or all of a paid invoice; ``body`` is the parsed request.

        Returns:
            The refund record, with what is still refundable on the invoice afterwards.

        Raises:
            BillingError: 400 (malformed body), 422 (amount or reason invalid), 404 (unknown
                invoice), 409 (invoice not paid, or the amount exceeds what is refundable).
        """
        invoice_id, amount, reason = _refund_fields(body)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                invoice = self._invoice(invoice_id)
                if invoice["status"] != "paid":
                    raise BillingError(
                        409, "invoice %s is %s, not paid: there is nothing to refund" % (invoice_id, invoice["status"])
                    )
                if amount > invoice["refundable_cents"]:
                    raise BillingError(
                        409,
                        "refund of %s exceeds the %s still refundable on invoice %s (amount %s, refunded %s)"
                        % (
                            _money(amount), _money(invoice["refundable_cents"]), invoice_id,
                            _money(invoice["amount_cents"]), _money(invoice["refunded_cents"]),
                        ),
                    )
                cursor = self._db.execute(
                    "INSERT INTO refunds (id, invoice_id, amount_cents, reason) VALUES ('', ?, ?, ?)",
                    (invoice_id, amount, reason),
                )
                seq = int(cursor.lastrowid or 0)
                refund_id = "R-%04d" % seq
                self._db.execute("UPDATE refunds SET id = ? WHERE seq = ?", (refund_id, seq))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return {
                "id": refund_id,
                "invoice_id": invoice_id,
                "account_id": invoice["account_id"],
                "amount_cents": amount,
                "currency": invoice["currency"],
                "reason": reason,
                "status": "refunded",
                "invoice_refundable_cents": invoice["refundable_cents"] - amount,
            }

    def _invoice(self, invoice_id: str) -> dict[str, Any]:
        row = self._db.execute("SELECT * FROM invoices WHERE id = ?", (invoice_id,)).fetchone()
        if row is None:
            raise BillingError(404, "no invoice %s" % invoice_id)
        refunds = [
            {"id": r["id"], "amount_cents": r["amount_cents"], "reason": r["reason"]}
            for r in self._db.execute("SELECT * FROM refunds WHERE invoice_id = ? ORDER BY seq", (invoice_id,))
        ]
        refunded = sum(r["amount_cents"] for r in refunds)
        return {
            "id": row["id"],
            "account_id": row["account_id"],
            "description": row["description"],
            "amount_cents": row["amount_cents"],
            "currency": row["currency"],
            "status": row["status"],
            "refunded_cents": refunded,
            "refundable_cents": max(0, row["amount_cents"] - refunded) if row["status"] == "paid" else 0,
            "refunds": refunds,
        }


def _refund_fields(body: Any) -> tuple[str, int, str]:
    """The refund request's fields, checked: 400 for the wrong shape, 422 for senseless values."""
    if not isinstance(body, dict):
        raise BillingError(400, "the body must be a JSON object with invoice_id, amount_cents and reason")
    unknown = sorted(set(body) - set(REFUND_FIELDS))
    if unknown:
        raise BillingError(
            400, "unknown field(s): %s (a refund takes invoice_id, amount_cents, reason)" % ", ".join(unknown)
        )
    for name, kind in REFUND_FIELDS.items():
        if name not in body:
            raise BillingError(400, "missing field %r" % name)
        value = body[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise BillingError(400, "field %r must be %s" % (name, "an integer" if kind is int else "a string"))
    amount, reason = body["amount_cents"], body["reason"].strip()
    if amount <= 0:
        raise BillingError(422, "amount_cents must be a positive number of cents (got %d)" % amount)
    if not reason:
        raise BillingError(422, "a refund needs a reason")
    if len(reason) > MAX_REASON_CHARS:
        raise BillingError(422, "the reason is longer than %d characters" % MAX_REASON_CHARS)
    if not _INVOICE_ID.match(body["invoice_id"]):
        raise BillingError(404, "no invoice %s" % body["invoice_id"][:40])
    return body["invoice_id"], amount, reason


class BillingServer(ThreadingHTTPServer):
    """The HTTP server; its handlers reach the state through ``billing``."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], billing: Billing) -> None:
        super().__init__(address, BillingHandler)
        self.billing = billing


class BillingHandler(BaseHTTPRequestHandler):
    """Routes requests to :class:`Billing` and answers JSON."""

    server: BillingServer
    server_version = "softprobe-billing/1"
    timeout = 10  # a client that stops sending does not hold a thread for long

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(self._get)

    def do_POST(self) -> None:  # noqa: N802
        self._answer(self._post)

    def do_PUT(self) -> None:  # noqa: N802
        self._answer(self._not_allowed)

    do_DELETE = do_PATCH = do_PUT  # noqa: N815

    def _get(self) -> tuple[int, Any]:
        billing = self.server.billing
        path = self.path.split("?", 1)[0]
        if path == "/health":
            return 200, {"status": "ok", "invoices": billing.count()}
        if path == "/invoices":
            return 200, billing.invoices()
        match = re.match(r"^/invoices/([^/]+)$", path)
        if match:
            invoice_id = urllib.parse.unquote(match.group(1))
            if not _INVOICE_ID.match(invoice_id):
                raise BillingError(404, "no invoice %s" % invoice_id[:40])
            return 200, billing.invoice(invoice_id)
        if path == "/refunds":
            raise BillingError(405, "POST a refund to /refunds")
        raise BillingError(404, "no such endpoint: GET %s" % path[:100])

    def _post(self) -> tuple[int, Any]:
        path = self.path.split("?", 1)[0]
        if path != "/refunds":
            if path in ("/health", "/invoices") or path.startswith("/invoices/"):
                raise BillingError(405, "%s is read-only: use GET" % path)
            raise BillingError(404, "no such endpoint: POST %s" % path[:100])
        return 201, self.server.billing.refund(self._json_body())

    def _not_allowed(self) -> tuple[int, Any]:
        raise BillingError(405, "method %s is not allowed" % self.command)

    def _json_body(self) -> Any:
        if self.headers.get("Transfer-Encoding"):
            raise BillingError(411, "send the body with a Content-Length, not chunked")
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            raise BillingError(411, "a Content-Length is required")
        try:
            length = int(length_text)
        except ValueError:
            raise BillingError(400, "Content-Length must be a number") from None
        if length < 0:
            raise BillingError(400, "Content-Length must not be negative")
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the unread body must not be parsed as a request
            raise BillingError(413, "the body is %d bytes; at most %d are accepted" % (length, MAX_BODY_BYTES))
        raw = self.rfile.read(length)
        try:
            return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except ValueError as err:
            raise BillingError(400, "the body is not valid JSON: %s" % err) from None

    def _answer(self, route: Any) -> None:
        try:
            status, payload = route()
        except BillingError as err:
            status, payload = err.status, {"error": err.message, "status": err.status}
        except Exception as err:  # reported to the client and the log, never a traceback page
            self.log_message("internal error: %s: %s", type(err).__name__, err)
            status, payload = 500, {"error": "internal error: %s" % type(err).__name__, "status": 500}
        body = (json.dumps(payload, sort_keys=True) + "\n").encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.path == "/health" and code == 200:
            return  # the healthcheck asks every interval: only its failures are news
        super().log_request(code, size)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        sys.stderr.write("billing: %s %s\n" % (self.address_string(), format % args))


def _no_constant(name: str) -> Any:
    raise ValueError("%s is not JSON" % name)


def make_server(db_path: str, fixture: str, host: str = "127.0.0.1", port: int = 0) -> BillingServer:
    """Create the database from ``fixture`` if ``db_path`` does not exist, open it, and bind a
    server (not yet serving) to ``host:port`` (0: a free port; see ``server_address``).

    Raises:
        RuntimeError: the database cannot be created or is not a billing database.
        OSError: the address cannot be bound.
    """
    create_database(db_path, fixture)
    billing = Billing(db_path)
    try:
        return BillingServer((host, port), billing)
    except BaseException:
        billing.close()
        raise


def main() -> int:
    """Serve until SIGTERM or SIGINT."""
    try:
        port = int(os.environ.get("BILLING_PORT", str(DEFAULT_PORT)))
        if not 0 <= port < 65536:
            raise ValueError(port)
    except ValueError:
        sys.stderr.write("billing: BILLING_PORT must be a port number (0-65535)\n")
        return 2
    host = os.environ.get("BILLING_HOST", "0.0.0.0")
    db_path = os.environ.get("BILLING_DB", DEFAULT_DB)
    try:
        server = make_server(db_path, os.environ.get("BILLING_FIXTURE", DEFAULT_FIXTURE), host, port)
    except (RuntimeError, OSError) as err:
        sys.stderr.write("billing: %s\n" % err)
        return 1

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    # As PID 1 a signal without a handler is ignored: without this, `docker stop` waits 10 s.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    sys.stdout.write("billing: listening on %s:%d (database %s)\n" % (bound_host, bound_port, db_path))
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        server.billing.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
