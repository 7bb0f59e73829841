"""JavaScript value semantics that promptfoo's assertions depend on, done in Python.

Promptfoo compares strings made the JavaScript way: ``String(1.0)`` is ``"1"``,
``JSON.stringify`` has no spaces, ``parseFloat("0.5abc")`` is 0.5, and deep equality never makes
``true`` equal ``1``. Getting these right is most of what parity with the real CLI takes.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any


def js_number(value: float | int) -> str:
    """``String(n)`` in JavaScript (ECMAScript Number::toString, radix 10)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) < 2**53:
        return str(value)
    x = float(value)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    # The shortest round-tripping digits (what repr gives), as digits and a decimal exponent.
    digits_tuple = Decimal(repr(abs(x))).normalize().as_tuple()
    digits = "".join(str(d) for d in digits_tuple.digits)
    k = len(digits)
    exponent = digits_tuple.exponent
    assert isinstance(exponent, int)  # x is finite: never the 'n'/'N'/'F' of NaN and Infinity
    n = exponent + k  # the position of the decimal point
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    exponent = n - 1
    mantissa = digits[0] + ("." + digits[1:] if k > 1 else "")
    return f"{sign}{mantissa}e{'+' if exponent >= 0 else '-'}{abs(exponent)}"


def js_string(value: Any) -> str:
    """``String(value)`` in JavaScript for JSON-like values."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return js_number(value)
    if isinstance(value, list):
        return ",".join("" if item is None else js_string(item) for item in value)
    if isinstance(value, dict):
        return "[object Object]"
    return str(value)


def json_stringify(value: Any) -> str:
    """``JSON.stringify(value)``: compact, numbers printed the JavaScript way, NaN as null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return "null" if isinstance(value, float) and not math.isfinite(value) else js_number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(json_stringify(item) for item in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{json_stringify(v)}" for k, v in value.items())
            + "}"
        )
    return json.dumps(str(value))


def as_json_written(value: Any) -> Any:
    """``value`` as ``JSON.parse(JSON.stringify(value))`` gives it back: what promptfoo's output
    file holds. Non-finite numbers become null (a score of Infinity is written as ``null``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: as_json_written(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json_written(v) for v in value]
    return value


def coerce_output(output: Any) -> str:
    """promptfoo's ``coerceString``: strings as they are, anything else as JSON."""
    return output if isinstance(output, str) else json_stringify(output)


# JavaScript's WhiteSpace and LineTerminator code points: what ``\s`` and ``String.prototype.trim``
# mean there. Unlike Python's ``str.isspace``, it has U+FEFF and lacks U+0085 and U+001C-U+001F.
JS_WHITESPACE = (
    "\t\n\v\f\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
JS_SPACE_CLASS = "[" + re.escape(JS_WHITESPACE) + "]"


def is_js_space(ch: str) -> bool:
    r"""``/\s/.test(ch)`` for one character."""
    return ch != "" and ch in JS_WHITESPACE


def js_trim(text: str) -> str:
    """``String.prototype.trim``."""
    return text.strip(JS_WHITESPACE)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _js_int(text: str) -> int | float:
    """A JSON integer as JavaScript reads it: one double (any length; ``-0`` keeps its sign)."""
    digits = len(text) - text.startswith("-")
    if digits <= 15:
        value = int(text)
        return -0.0 if value == 0 and text.startswith("-") else value
    return float(text)  # rounds as JavaScript does; past the double range it is infinity


def json_parse(text: str) -> Any:
    """``JSON.parse``: strict JSON (no NaN or Infinity), numbers as JavaScript's doubles.

    Raises:
        ValueError: the text is not JSON.
    """
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_int=_js_int)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def to_js_number(value: int | float) -> float:
    """A Python number as a JavaScript double (huge integers become infinity)."""
    try:
        return float(value)
    except OverflowError:
        return math.copysign(math.inf, value)


def deep_strict_equal(a: Any, b: Any) -> bool:
    """Node's ``util.isDeepStrictEqual`` for JSON values: ``true`` never equals ``1``, ``1``
    equals ``1.0`` (one number type), ``-0`` does not equal ``0`` and ``NaN`` equals ``NaN``
    (``Object.is``); objects compare by keys, regardless of order."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        x, y = to_js_number(a), to_js_number(b)
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(deep_strict_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(deep_strict_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


_JS_FLOAT_PREFIX = re.compile("^" + JS_SPACE_CLASS + r"*([+-]?(?:Infinity|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))")


def js_parse_float(text: str) -> float:
    """``Number.parseFloat``: the longest numeric prefix, NaN when there is none."""
    match = _JS_FLOAT_PREFIX.match(text)
    if not match:
        return math.nan
    token = match.group(1)
    if token.lstrip("+-") == "Infinity":
        return -math.inf if token.startswith("-") else math.inf
    return float(token)


def js_lower(text: str) -> str:
    """``String.prototype.toLowerCase`` (full Unicode lower-casing, as Python's ``lower``)."""
    return text.lower()


def utf16_units(text: str) -> list[int]:
    """The UTF-16 code units of ``text`` (how JavaScript measures strings)."""
    data = text.encode("utf-16-le", "surrogatepass")
    return [data[i] | (data[i + 1] << 8) for i in range(0, len(data), 2)]


def split_comma_values(value: str) -> list[str]:
    """promptfoo's CSV-style split of ``contains-any``/``contains-all`` values.

    Quoted fields keep commas (``\\"`` and ``""`` escape a quote); unquoted fields are trimmed;
    empty fields are dropped.

    Raises:
        ValueError: an unterminated quote, or text after a closing quote.
    """
    results: list[str] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and (is_js_space(value[i]) or value[i] == ","):
            i += 1
        if i >= n:
            break
        if value[i] == '"':
            i += 1
            field, terminated = [], False
            while i < n:
                if value[i] == "\\" and i + 1 < n and value[i + 1] in '"\\':
                    field.append(value[i + 1])
                    i += 2
                elif value[i] == '"' and i + 1 < n and value[i + 1] == '"':
                    field.append('"')
                    i += 2
                elif value[i] == '"':
                    i += 1
                    terminated = True
                    break
                else:
                    field.append(value[i])
                    i += 1
            if not terminated:
                raise ValueError("Unterminated quoted field in contains assertion value")
            results.append("".join(field))
            while i < n and is_js_space(value[i]):
                i += 1
            if i < n and value[i] != ",":
                raise ValueError("Expected comma after quoted field in contains assertion value")
        else:
            start = i
            while i < n and value[i] != ",":
                i += 1
            results.append(js_trim(value[start:i]))
    return results
