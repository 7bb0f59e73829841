"""JSON Schema as promptfoo checks it: Ajv 8 in strict mode with ajv-formats (full), draft-07.

What that means, and what this module reproduces on top of ``jsonschema``'s Draft 7 validator:

- only draft-07 is known: a ``$schema`` naming another draft is an error
  (``no schema with key or ref ...``);
- strict mode: a keyword Ajv does not know is an error (``strict mode: unknown keyword``), and so
  is a ``format`` ajv-formats does not define (``unknown format ... ignored in schema``);
- formats are enforced (ajv-formats' own regular expressions and checks);
- OpenAPI ``nullable: true`` adds ``null`` to the ``type`` (and needs a ``type``);
- ``pattern`` / ``patternProperties`` are JavaScript regexes compiled with the ``u`` flag
  (``\\d`` is ASCII, ``\\p{L}`` is valid).

A schema that fails these checks raises :class:`SchemaCompileError` (promptfoo throws: the test is
an ERROR). Errors are reported as Ajv's ``errorsText`` roughly does (``data/a must ...``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
from jsonschema import validators

from ._ajv_formats import REGEX_FORMATS
from .jsregex import JsRegexError, js_regex_test, unicode_regex_test

DRAFT7_IDS = frozenset({"http://json-schema.org/draft-07/schema", "http://json-schema.org/draft-07/schema#"})

# Ajv 8's draft-07 vocabularies (core, validation, applicator, format, metadata, content) + nullable.
KNOWN_KEYWORDS = frozenset(
    [
        "$id", "$schema", "$ref", "$comment", "$defs", "definitions", "title", "description", "default",
        "deprecated", "readOnly", "writeOnly", "examples", "type", "enum", "const", "multipleOf", "maximum",
        "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "additionalItems",
        "items", "maxItems", "minItems", "uniqueItems", "contains", "maxProperties", "minProperties", "required",
        "additionalProperties", "properties", "patternProperties", "dependencies", "propertyNames", "if", "then",
        "else", "allOf", "anyOf", "oneOf", "not", "format", "contentMediaType", "contentEncoding", "contentSchema",
        "nullable",
    ]
)
_SCHEMA_VALUED = ("additionalItems", "contains", "additionalProperties", "propertyNames", "if", "then",
                  "else", "not", "contentSchema")
_SCHEMA_MAPS = ("properties", "patternProperties", "definitions", "$defs")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_NUMBER_FORMATS = frozenset({"int32", "int64", "float", "double"})
_FUNCTION_FORMATS = frozenset({"date", "time", "date-time", "iso-time", "iso-date-time", "uri", "byte", "regex",
                               "password", "binary"}) | _NUMBER_FORMATS
KNOWN_FORMATS = frozenset(REGEX_FORMATS) - {"__URI"} | _FUNCTION_FORMATS


class SchemaCompileError(ValueError):
    """Ajv would refuse to compile the schema (promptfoo throws: the test is an ERROR)."""


def _check(schema: Any, path: str) -> Any:
    """Strict-mode checks of one (sub)schema; returns it with ``nullable`` folded into ``type``."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise SchemaCompileError(f"schema is invalid: {path or '#'} must be object,boolean")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in KNOWN_KEYWORDS:
            raise SchemaCompileError(f'strict mode: unknown keyword: "{key}"')
        if key in _SCHEMA_VALUED:
            out[key] = _check(value, f"{path}/{key}")
        elif key == "items":
            out[key] = [_check(v, f"{path}/items/{i}") for i, v in enumerate(value)] if isinstance(value, list) \
                else _check(value, f"{path}/items")
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: _check(v, f"{path}/{key}/{k}") for k, v in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_check(v, f"{path}/{key}/{i}") for i, v in enumerate(value)]
        elif key == "dependencies" and isinstance(value, dict):
            out[key] = {k: v if isinstance(v, list) else _check(v, f"{path}/{key}/{k}") for k, v in value.items()}
        else:
            out[key] = value
    key_format = out.get("format")
    if isinstance(key_format, str) and key_format not in KNOWN_FORMATS:
        raise SchemaCompileError(f'unknown format "{key_format}" ignored in schema at path "#{path}"')
    for key in ("pattern",):
        if isinstance(out.get(key), str):
            _compile_pattern(out[key])
    if isinstance(out.get("patternProperties"), dict):
        for pattern in out["patternProperties"]:
            _compile_pattern(pattern)
    if "nullable" in out:
        nullable = out.pop("nullable")
        if nullable is True:
            if "type" not in out:
                raise SchemaCompileError('"nullable" cannot be used without "type"')
            types = out["type"] if isinstance(out["type"], list) else [out["type"]]
            out["type"] = types if "null" in types else [*types, "null"]
            if isinstance(out.get("enum"), list) and None not in out["enum"]:
                out["enum"] = [*out["enum"], None]
    return out


def _compile_pattern(pattern: str) -> None:
    try:
        unicode_regex_test(pattern, "")
    except JsRegexError as err:
        raise SchemaCompileError(f"schema is invalid: {err}") from None


# -- formats -------------------------------------------------------------------------------------

_DATE = re.compile(r"^(\d\d\d\d)-(\d\d)-(\d\d)$", re.ASCII)
_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d(?:\.\d+)?)(z|([+-])(\d\d)(?::?(\d\d))?)?$", re.ASCII | re.IGNORECASE)
_DAYS = [0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def _date(text: str) -> bool:
    m = _DATE.match(text)
    if not m:
        return False
    year, month, day = int(m[1]), int(m[2]), int(m[3])
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return 1 <= month <= 12 and 1 <= day <= (29 if month == 2 and leap else _DAYS[month])


def _time(text: str, strict_tz: bool) -> bool:
    m = _TIME.match(text)
    if not m or text.endswith("\n"):
        return False
    hr, minute, sec = int(m[1]), int(m[2]), float(m[3])
    tz_sign = -1 if m[5] == "-" else 1
    tz_h, tz_m = int(m[6] or 0), int(m[7] or 0)
    if tz_h > 23 or tz_m > 59 or (strict_tz and not m[4]):
        return False
    if hr <= 23 and minute <= 59 and sec < 60:
        return True
    utc_min = minute - tz_m * tz_sign
    utc_hr = hr - tz_h * tz_sign - (1 if utc_min < 0 else 0)
    return utc_hr in (23, -1) and utc_min in (59, -1) and sec < 61


def _date_time(text: str, strict_tz: bool) -> bool:
    parts = re.split(r"t|[\s\ufeff]", text, flags=re.IGNORECASE)  # /t|\s/i
    return len(parts) == 2 and _date(parts[0]) and _time(parts[1], strict_tz)


def _regex_test(name: str, text: str) -> bool:
    source, flags = REGEX_FORMATS[name]
    return unicode_regex_test(source, text, flags) if flags else js_regex_test(source, text)


def _format_ok(name: str, value: Any) -> bool:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if name in _NUMBER_FORMATS:
        if not is_number:
            return True
        if name in ("float", "double"):
            return True
        integral = math.isfinite(value) and float(value).is_integer()
        return integral and (name == "int64" or -(2**31) <= value <= 2**31 - 1)
    if not isinstance(value, str):
        return True
    if name == "date":
        return _date(value)
    if name in ("time", "iso-time"):
        return _time(value, name == "time")
    if name in ("date-time", "iso-date-time"):
        return _date_time(value, name == "date-time")
    if name == "uri":
        return bool(re.search(r"/|:", value)) and _regex_test("__URI", value)
    if name == "byte":
        return _byte(value)
    if name == "regex":
        if re.search(r"[^\\]\\Z", value):
            return False
        try:
            js_regex_test(value, "")
        except JsRegexError:
            return False
        return True
    if name in ("password", "binary"):
        return True
    return _regex_test(name, value)


def _byte(text: str) -> bool:
    # /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/gm: any line matches
    line = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
    return any(re.fullmatch(line, piece) for piece in re.split(r"\r\n|[\n\r\u2028\u2029]", text))


# -- the validator ---------------------------------------------------------------------------------


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if isinstance(instance, str) and not unicode_regex_test(pattern, instance):
        yield jsonschema.ValidationError(f'must match pattern "{pattern}"')


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
    if not isinstance(instance, dict):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if unicode_regex_test(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not isinstance(instance, dict):
        return
    known = set(schema.get("properties", {}))
    patterns = list(schema.get("patternProperties", {}))
    extras = [k for k in instance if k not in known and not any(unicode_regex_test(p, k) for p in patterns)]
    if isinstance(additional, dict):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        yield jsonschema.ValidationError("must NOT have additional properties")


def _format(validator: Any, name: str, instance: Any, schema: Any) -> Iterator[jsonschema.ValidationError]:
    if not _format_ok(name, instance):
        yield jsonschema.ValidationError(f'must match format "{name}"')


def _is_number(checker: Any, instance: Any) -> bool:
    """Ajv's ``number``: a finite JavaScript number (a 400-digit integer parses to Infinity)."""
    return isinstance(instance, (int, float)) and not isinstance(instance, bool) and math.isfinite(instance)


def _is_integer(checker: Any, instance: Any) -> bool:
    return _is_number(checker, instance) and float(instance).is_integer()


_TYPES = jsonschema.Draft7Validator.TYPE_CHECKER.redefine_many({"number": _is_number, "integer": _is_integer})

# types-jsonschema leaves validators.extend unannotated (it returns a validator class, Any here).
_AjvDraft7 = validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft7Validator,
    type_checker=_TYPES,
    validators={"pattern": _pattern, "patternProperties": _pattern_properties,
                "additionalProperties": _additional_properties, "format": _format},
)


_META = jsonschema.Draft7Validator(jsonschema.Draft7Validator.META_SCHEMA)


def compile_schema(schema: Any) -> Any:
    """``getAjv().compile(schema)``: a validator with ``is_valid`` and ``iter_errors``.

    Raises:
        SchemaCompileError: Ajv would throw (see the module docstring for when).
    """
    if isinstance(schema, dict) and "$schema" in schema and schema["$schema"] not in DRAFT7_IDS:
        raise SchemaCompileError(f'no schema with key or ref "{schema["$schema"]}"')
    checked = _check(schema, "")
    meta = {k: v for k, v in checked.items() if k != "$schema"} if isinstance(checked, dict) else checked
    # Meta-validation without Python's format checks (``pattern`` was checked as a u-flag regex).
    problem = jsonschema.exceptions.best_match(_META.iter_errors(meta))
    if problem is not None:
        where = "".join(f"/{p}" for p in problem.absolute_path)
        raise SchemaCompileError(f"schema is invalid: data{where} {problem.message}")
    return _AjvDraft7(checked)


def errors_text(validator: Any, instance: Any) -> str:
    """Ajv's ``errorsText``: ``data/path message`` joined with ``, ``."""
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    return ", ".join(f"data{''.join(f'/{part}' for part in e.absolute_path)} {e.message}" for e in errors)
