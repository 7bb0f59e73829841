"""JavaScript regular expressions as promptfoo builds them: ``new RegExp(value)``, no flags, Node 20.

The engine is ``regress`` (an ECMAScript regex engine). Two things make its default mode differ
from ``new RegExp(pattern)`` without the ``u`` flag, and this module closes both gaps:

- **UTF-16 code units.** Without ``u``, JavaScript matches code units: an emoji is two
  characters (``^.$`` does not match it) and ``\\uD83D`` matches its high half. regress matches
  code points, so text and pattern are both rewritten: each UTF-16 surrogate unit becomes one
  character of the Private Use Area (U+E000 + (unit - U+D800)), and ``\\uD8xx`` escapes in the
  pattern name those characters. The mapping is exact except for text or patterns that also use
  U+E000-U+E7FF themselves, or character-class ranges with exactly one surrogate end.
- **Node 20's syntax.** Without ``u``, ``\\u{...}`` is not a code-point escape (it is the letter
  ``u`` and a quantifier); inline modifiers ``(?i:...)`` and duplicate named groups are syntax
  errors in Node 20 (V8 accepts them from Node 23/24). regress accepts all three, so they are
  rewritten or rejected here. We follow the Node version the pinned promptfoo 0.121 CLI runs
  on (Node 20); a CLI on a newer Node would accept modifiers and duplicate names.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Protocol

import regress

_SURROGATE_BASE = 0xE000
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")
_GROUP_NAME = re.compile(r"<([^>]*)>")


class JsRegexError(ValueError):
    """The pattern is not a valid JavaScript regular expression (as Node 20 reads it)."""


class _Matcher(Protocol):
    def find(self, text: str) -> object | None: ...


def to_code_units(text: str) -> str:
    """``text`` with each UTF-16 surrogate unit as one Private Use Area character (see above)."""
    if not any(ord(ch) > 0xD7FF for ch in text):
        return text
    data = text.encode("utf-16-le", "surrogatepass")
    out = []
    for i in range(0, len(data), 2):
        unit = data[i] | (data[i + 1] << 8)
        out.append(chr(_SURROGATE_BASE + unit - 0xD800) if 0xD800 <= unit <= 0xDFFF else chr(unit))
    return "".join(out)


def _translate(pattern: str) -> str:
    """The pattern for regress, in non-``u`` mode over code-unit text.

    Raises:
        JsRegexError: syntax Node 20 rejects and regress would accept.
    """
    source = to_code_units(pattern)
    out: list[str] = []
    names: set[str] = set()
    in_class = False
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        if ch == "\\":
            if i + 1 >= n:
                raise JsRegexError("Invalid regular expression: \\ at end of pattern")
            nxt = source[i + 1]
            if nxt == "u":
                hex4 = source[i + 2 : i + 6]
                if _HEX4.fullmatch(hex4):
                    unit = int(hex4, 16)
                    if 0xD800 <= unit <= 0xDFFF:
                        out.append(f"\\u{_SURROGATE_BASE + unit - 0xD800:04X}")
                    else:
                        out.append(source[i : i + 6])
                    i += 6
                    continue
                out.append("u")  # an identity escape without the u flag: \u{1F600} is "u" + "{1F600}"
                i += 2
                continue
            out.append(source[i : i + 2])
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
        elif ch == "[":
            in_class = True
        elif ch == "(" and source.startswith("?", i + 1):
            rest = source[i + 2 : i + 4]
            if rest[:1] in (":", "=", "!") or rest in ("<=", "<!"):
                pass
            elif rest[:1] == "<":
                match = _GROUP_NAME.match(source, i + 2)
                if match:
                    if match.group(1) in names:
                        raise JsRegexError(f"Invalid regular expression: /{pattern}/: Duplicate capture group name")
                    names.add(match.group(1))
            else:
                raise JsRegexError(f"Invalid regular expression: /{pattern}/: Invalid group")
        out.append(ch)
        i += 1
    return "".join(out)


@lru_cache(maxsize=256)
def compile_js_regex(pattern: str) -> _Matcher:
    """``new RegExp(pattern)`` (no flags) as Node 20 compiles it.

    Raises:
        JsRegexError: the pattern is invalid there.
    """
    translated = _translate(pattern)
    try:
        return regress.Regex(translated)
    except regress.RegressError as err:
        raise JsRegexError(f"Invalid regular expression: /{pattern}/: {err}") from None


def js_regex_test(pattern: str, text: str) -> bool:
    """``new RegExp(pattern).test(text)``.

    Raises:
        JsRegexError: the pattern is invalid in Node 20.
    """
    return compile_js_regex(pattern).find(to_code_units(text)) is not None


@lru_cache(maxsize=256)
def compile_unicode_regex(pattern: str, flags: str = "u") -> _Matcher:
    """``new RegExp(pattern, flags)`` with the ``u`` flag (Ajv's ``pattern``), code points.

    Raises:
        JsRegexError: the pattern is invalid in unicode mode.
    """
    try:
        return regress.Regex(pattern, flags)
    except regress.RegressError as err:
        raise JsRegexError(f"Invalid regular expression: /{pattern}/{flags}: {err}") from None


def unicode_regex_test(pattern: str, text: str, flags: str = "u") -> bool:
    """``new RegExp(pattern, flags).test(text)`` on text without lone surrogates.

    Raises:
        JsRegexError: the pattern is invalid.
    """
    return compile_unicode_regex(pattern, flags).find(text) is not None
