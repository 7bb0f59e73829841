"""The billing service's healthcheck: exit 0 when ``GET /health`` on this container's
``$BILLING_PORT`` answers ``{"status": "ok"}``, else 1 with one line on stderr."""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def main() -> int:
    url = "http://127.0.0.1:%s/health" % os.environ.get("BILLING_PORT", "8080")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        with opener.open(url, timeout=2) as response:
            healthy = response.status == 200 and json.load(response).get("status") == "ok"
    except (OSError, ValueError, AttributeError) as err:
        sys.stderr.write("billing is not healthy: %s\n" % err)
        return 1
    if not healthy:
        sys.stderr.write("billing is not healthy: %s answered without status ok\n" % url)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
