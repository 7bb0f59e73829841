"""The canonical request form and its digest: the same request always gives the same bytes.

Canonical JSON is ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
allow_nan=False)`` encoded as UTF-8. What that normalises, exactly:

- object key order (keys sorted by code point, at every depth);
- whitespace between tokens (none at all);
- string escapes: non-ASCII characters are written as themselves (UTF-8), not ``\\uXXXX``;
  control characters, ``"`` and ``\\`` as JSON's short escapes.

What it does *not* normalise (each is a different request): whitespace *inside* strings, Unicode
normal forms (NFC vs NFD), ``1`` vs ``1.0`` (an int and a float), list order. NaN and infinities
are refused (JSON has none). Only JSON values (dict with str keys, list, str, int, float, bool,
None) are accepted.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from softprobe.gym.errors import TapeError


def canonical_json(value: Any) -> bytes:
    """The canonical UTF-8 JSON bytes of ``value``.

    Raises:
        TapeError: ``value`` is not a JSON value (or holds NaN/infinity).
    """
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8")  # a lone surrogate fails here (UnicodeEncodeError, a ValueError)
    except (TypeError, ValueError) as err:
        raise TapeError(f"a tape request must be a JSON value: {err}") from None


def sha256_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_digest(value: Any) -> str:
    """``sha256:<hex>`` of :func:`canonical_json` of ``value``."""
    return sha256_digest(canonical_json(value))


__all__ = ["canonical_digest", "canonical_json", "sha256_digest"]
