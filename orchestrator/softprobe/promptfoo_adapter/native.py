"""The native backend: promptfoo's deterministic assertions, graded in Python.

Each handler follows promptfoo 0.121's source (``src/assertions/*.ts``): same pass, same score,
same reasons where it matters. Where promptfoo *throws* (a malformed value, missing data) the
whole test is an ERROR, not a FAIL; handlers signal that by raising :class:`InvalidAssertion`.
Assertion values are taken literally (promptfoo templates them with Nunjucks; the CLI backend
escapes them so both backends see the same literal value).
"""

from __future__ import annotations

import fnmatch
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import python_runner
from .ajv import SchemaCompileError, compile_schema, errors_text
from .cli_backend import config_problem
from .errors import UnsupportedAssertionError
from .jsregex import JsRegexError, js_regex_test
from .jsvalues import (
    coerce_output,
    deep_strict_equal,
    is_js_space,
    js_number,
    js_parse_float,
    js_string,
    json_parse,
    json_stringify,
    split_comma_values,
)
from .jsyaml import JsYamlError, load_yaml
from .models import Assertion, EvalCase, TrajectoryStep
from .textmetrics import bleu, levenshtein, rouge_n


class InvalidAssertion(Exception):
    """promptfoo would throw here: the test is graded as an ERROR (status ``invalid_input``)."""

    status = "invalid_input"
    path: str | None = None  # where in the test it was raised (``assert[1].assert[0]``), once known


class MissingEvidence(InvalidAssertion):
    """The assertion needs data the rollout does not carry (status ``missing_evidence``)."""

    status = "missing_evidence"


@dataclass
class _Params:
    assertion: Assertion
    base_type: str
    inverse: bool
    output: str
    value: Any
    value_given: bool
    case: EvalCase


Grade = dict[str, Any]  # {"pass", "score", "reason", ...} like promptfoo's GradingResult


def _result(params: _Params, passed: bool, failure: str) -> Grade:
    return {"pass": passed, "score": 1.0 if passed else 0.0, "reason": "Assertion passed" if passed else failure}


def _require(condition: Any, message: str) -> None:
    if not condition:
        raise InvalidAssertion(message)


def _not(p: _Params) -> str:
    return "not " if p.inverse else ""


# -- string assertions ---------------------------------------------------------------------------


def _is_contains_value(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return (isinstance(value, str) and value != "") or (isinstance(value, (int, float)) and not math.isnan(value))


def _contains(p: _Params) -> Grade:
    _require(_is_contains_value(p.value), f'"{p.base_type}" assertion type must have a string or number value')
    needle = js_string(p.value)
    if p.base_type == "icontains":
        found = needle.lower() in p.output.lower()
    else:
        found = needle in p.output
    passed = found != p.inverse
    return _result(p, passed, f'Expected output to {_not(p)}contain "{needle}"')


def _list_value(p: _Params) -> list[Any]:
    value = p.value
    _require(_truthy(value), f'"{p.base_type}" assertion type must have a value')
    if isinstance(value, str):
        try:
            value = split_comma_values(value)
        except ValueError as err:
            raise InvalidAssertion(str(err)) from None
    if not isinstance(value, list):
        raise InvalidAssertion(f'"{p.base_type}" assertion type must have an array value')
    return value


def _contains_any_all(p: _Params) -> Grade:
    items = [js_string(v) for v in _list_value(p)]
    fold = p.base_type.startswith("i")
    haystack = p.output.lower() if fold else p.output
    present = [(v.lower() if fold else v) in haystack for v in items]
    if p.base_type.endswith("-any"):
        passed = any(present) != p.inverse
        return _result(p, passed, f'Expected output to {_not(p)}contain one of "{", ".join(items)}"')
    missing = [v for v, ok in zip(items, present, strict=True) if not ok]
    passed = (not missing) != p.inverse
    return _result(
        p, passed, f"Expected output to {_not(p)}contain all of [{', '.join(items)}]. Missing: [{', '.join(missing)}]"
    )


def _equals(p: _Params) -> Grade:
    value = p.value
    if isinstance(value, (dict, list)) or (value is None and p.value_given):
        try:
            passed = deep_strict_equal(value, json_parse(p.output)) != p.inverse
        except ValueError:
            passed = p.inverse
        shown = json_stringify(value)
    else:
        shown = js_string(value) if p.value_given else "undefined"
        passed = (shown == p.output) != p.inverse
    return _result(p, passed, f'Expected output "{p.output}" to {_not(p)}equal "{shown}"')


def _starts_with(p: _Params) -> Grade:
    _require(_truthy(p.value) and isinstance(p.value, str), '"starts-with" assertion type must have a string value')
    passed = p.output.startswith(p.value) != p.inverse
    return _result(p, passed, f'Expected output to {_not(p)}start with "{p.value}"')


def _regex(p: _Params) -> Grade:
    _require(_truthy(p.value) and isinstance(p.value, str), '"regex" assertion type must have a string value')
    try:
        found = js_regex_test(p.value, p.output)
    except JsRegexError as err:  # an invalid pattern fails, whatever not- says
        return {"pass": False, "score": 0.0, "reason": f"Invalid regex pattern: {err}"}
    passed = found != p.inverse
    return _result(p, passed, f'Expected output to {_not(p)}match regex "{p.value}"')


# -- JSON ----------------------------------------------------------------------------------------


def _schema_validator(p: _Params) -> Any:
    value = p.value
    if isinstance(value, str):
        if value.startswith("file://"):
            raise InvalidAssertion(f"{p.base_type} with a file:// schema is not supported natively")
        try:
            schema = load_yaml(value)
        except JsYamlError as err:
            raise InvalidAssertion(f"invalid schema: {err}") from None
    elif isinstance(value, dict):
        schema = value
    else:
        raise InvalidAssertion(f"{p.base_type} assertion must have a string or object value")
    try:
        return compile_schema(schema)
    except SchemaCompileError as err:
        raise InvalidAssertion(str(err)) from None


def _is_json(p: _Params) -> Grade:
    try:
        parsed, ok = json_parse(p.output), True
    except ValueError:
        parsed, ok = None, False
    passed = ok != p.inverse
    if ok and _truthy(p.value):
        validator = _schema_validator(p)
        valid = validator.is_valid(parsed)
        passed = valid != p.inverse
        if not passed:
            reason = (
                "Output is JSON that conforms to the provided schema"
                if p.inverse
                else f"JSON does not conform to the provided schema. Errors: {errors_text(validator, parsed)}"
            )
            return {"pass": False, "score": 0.0, "reason": reason}
    return _result(p, passed, "Expected output to be valid JSON")


def extract_json_objects(text: str) -> list[Any]:
    """promptfoo's ``extractJsonObjects``: each balanced ``{...}`` that parses, left to right."""
    found: list[Any] = []
    max_length = 100_000
    i = 0
    while i < len(text):
        if text[i] != "{":
            i += 1
            continue
        opened, closed, j = 1, 0, i + 1
        while j < min(i + max_length, len(text)) and opened > closed:
            if text[j] == "{":
                opened += 1
            if text[j] == "}":
                closed += 1
            j += 1
            if opened == closed or j == len(text) or j == i + max_length:
                candidate = text[i:j] + "}" * max(0, opened - closed)
                parsed = _parse_json_like(candidate)
                if isinstance(parsed, (dict, list)):
                    found.append(parsed)
                    i = j - 1
                    break
                if opened == closed:
                    break
        i += 1
    return found


def _parse_json_like(candidate: str) -> Any:
    """promptfoo's ``loadYaml(convertSlashCommentsToHash(candidate), {json: true})``."""
    try:
        return load_yaml(convert_slash_comments_to_hash(candidate), json_mode=True)
    except JsYamlError:
        return None


def _escaped_quote(line: str, index: int) -> bool:
    count, j = 0, index - 1
    while j >= 0 and line[j] == "\\":
        count, j = count + 1, j - 1
    return count % 2 == 1


def _ascii_letter(ch: str) -> bool:
    return len(ch) == 1 and ("a" <= ch <= "z" or "A" <= ch <= "Z")


def convert_slash_comments_to_hash(text: str) -> str:
    """promptfoo's ``convertSlashCommentsToHash``: ``// comment`` becomes ``# comment`` outside
    quotes (and outside ``scheme://`` tokens), one ``#`` per two slashes."""
    out_lines = []
    for line in text.split("\n"):
        state, result, i, converted = "normal", [], 0, None
        while i < len(line):
            ch = line[i]
            nxt = line[i + 1] if i + 1 < len(line) else ""
            prev = line[i - 1] if i > 0 else ""
            if state == "normal":
                if ch == "'" and not _ascii_letter(prev):
                    state = "single"
                    result.append(ch)
                elif ch == '"':
                    state = "double"
                    result.append(ch)
                elif ch == "/" and nxt == "/":
                    token_start = 0
                    for j in range(i - 1, -1, -1):
                        if is_js_space(line[j]):
                            token_start = j + 1
                            break
                    if "://" in line[token_start:i + 2]:
                        result.append(ch)  # a URL: JavaScript's `break` leaves the switch only
                        i += 1
                        continue
                    slashes = 2
                    while i + slashes < len(line) and line[i + slashes] == "/":
                        slashes += 1
                    converted = "".join(result) + "#" * (slashes // 2) + line[i + slashes:]
                    break
                else:
                    result.append(ch)
            elif state == "single":
                result.append(ch)
                if ch == "'" and not _escaped_quote(line, i) and not _ascii_letter(nxt):
                    state = "normal"
            else:
                result.append(ch)
                if ch == '"' and not _escaped_quote(line, i):
                    state = "normal"
            i += 1
        out_lines.append(converted if converted is not None else "".join(result))
    return "\n".join(out_lines)


def _contains_json(p: _Params) -> Grade:
    objects = extract_json_objects(p.output)
    passed = (len(objects) == 0) if p.inverse else (len(objects) > 0)
    message = "Expected output to contain valid JSON"
    if _truthy(p.value):
        validator = _schema_validator(p)
        for obj in objects:
            valid = validator.is_valid(obj)
            passed = (not valid) if p.inverse else valid
            if valid:
                if p.inverse:
                    message = "Output contains JSON conforming to the provided schema"
                break
            message = f"JSON does not conform to the provided schema. Errors: {errors_text(validator, obj)}"
    return _result(p, passed, message)


# -- similarity ----------------------------------------------------------------------------------


def _levenshtein(p: _Params) -> Grade:
    _require(isinstance(p.value, str), '"levenshtein" assertion type must have a string value')
    distance = levenshtein(p.output, p.value)
    threshold = p.assertion.threshold if p.assertion.threshold is not None else 5
    passed = (distance <= threshold) != p.inverse
    comparison = "less than or equal to" if p.inverse else "greater than"
    return _result(p, passed, f"Levenshtein distance {distance} is {comparison} threshold {js_number(threshold)}")


def _rouge_n(p: _Params) -> Grade:
    _require(isinstance(p.value, str), '"rouge" assertion type must be a string value')
    score = rouge_n(p.output.lower(), p.value.lower())
    threshold = p.assertion.threshold if p.assertion.threshold is not None else 0.75
    comparison = "greater than or equal to" if score >= threshold else "less than"
    return {
        "pass": (score >= threshold) != p.inverse,
        "score": 1 - score if p.inverse else score,
        "reason": f"ROUGE-N score {score:.2f} is {comparison} threshold {js_number(threshold)}",
    }


def _bleu(p: _Params) -> Grade:
    value = p.value
    _require(
        isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
        '"bleu" assertion type must have a string or array of strings value',
    )
    threshold = p.assertion.threshold if p.assertion.threshold is not None else 0.5
    references = value if isinstance(value, list) else [value]
    try:
        score = bleu(p.output, references)
    except ValueError as err:
        raise InvalidAssertion(str(err)) from None
    passed = (score >= threshold) != p.inverse
    comparison = "greater" if p.inverse else "less"
    return {
        "pass": passed,
        "score": 1 - score if p.inverse else score,
        "reason": "Assertion passed" if passed
                  else f"BLEU score {score:.4f} is {comparison} than threshold {js_number(threshold)}",
    }


# -- measured --------------------------------------------------------------------------------------


def _measured(p: _Params, value: float | None, what: str, field: str, shown: str, unit: str = "") -> Grade:
    """latency and cost: pass when the caller-supplied value is at most the threshold."""
    if p.assertion.threshold is None:
        raise InvalidAssertion(f"{what} assertion must have a threshold")
    if value is None:
        raise MissingEvidence(f"{what} assertion needs the rollout's {field}")
    passed = (value <= p.assertion.threshold) != p.inverse
    comparison = "less than or equal to" if p.inverse else "greater than"
    threshold = js_number(p.assertion.threshold)
    return _result(p, passed, f"{what} {shown}{unit} is {comparison} threshold {threshold}{unit}")


def _latency(p: _Params) -> Grade:
    value = p.case.latency_ms
    return _measured(p, value, "Latency", "latency_ms", js_number(value) if value is not None else "", "ms")


def _cost(p: _Params) -> Grade:
    value = p.case.cost
    return _measured(p, value, "Cost", "cost", f"{value:.2g}" if value is not None else "")


# -- python ----------------------------------------------------------------------------------------


def _python(p: _Params) -> Grade:
    _require(isinstance(p.value, str), "python assertion must have a string value")
    context = python_context(p.case, p.output, p.assertion)
    try:
        if p.value.startswith("file://"):
            outcome = python_runner.run_file(p.value[len("file://"):], [p.output, context])
        else:
            outcome = python_runner.run_inline(p.value, [p.output, context])
        return _normalize_script_result(p, outcome)
    except python_runner.ScriptError as err:
        return {"pass": False, "score": 0.0, "reason": f"Python code execution failed: {err}"}


def _token_usage() -> dict[str, Any]:
    details = {"reasoning": 0, "acceptedPrediction": 0, "rejectedPrediction": 0, "cacheReadInputTokens": 0,
               "cacheCreationInputTokens": 0}
    return {"prompt": 0, "completion": 0, "cached": 0, "total": 0, "numRequests": 0, "completionDetails": dict(details),
            "assertions": {"total": 0, "prompt": 0, "completion": 0, "cached": 0, "numRequests": 0,
                           "completionDetails": dict(details)}}


def python_context(case: EvalCase, output: str, assertion: Assertion) -> dict[str, Any]:
    """The ``context`` a python assertion receives, with promptfoo's keys: ``prompt``, ``vars``,
    ``test``, ``provider``, ``providerResponse`` and (when the assertion has one) ``config``.
    ``logProbs`` is undefined for a recorded output, so, as in promptfoo's JSON, it is absent."""
    context: dict[str, Any] = {
        "prompt": "",
        "vars": {},
        "test": {
            "description": case.attempt_id,
            "providerOutput": case.final_output,
            "metadata": {"attemptId": case.attempt_id, "trajectoryDigest": case.trajectory_digest,
                         "sourceTraceId": case.source_trace_id},
            "assert": [a.to_config() for a in case.assertions],
            "vars": {},
            "options": {},
        },
        "provider": {"options": {"config": {}, "env": {}}, "label": "", "config": {}, "delay": 0},
        "providerResponse": {"output": output, "tokenUsage": _token_usage(), "cost": 0, "cached": False,
                             "providerTransformedOutput": output},
    }
    if case.threshold is not None:
        context["test"]["threshold"] = case.threshold
    if assertion.config:
        context["config"] = assertion.config
    return context


def _normalize_script_result(p: _Params, result: Any) -> Grade:
    if result is True or (isinstance(result, str) and result.lower() == "true"):
        return _script_value(p, True)
    if result is False or (isinstance(result, str) and result.lower() == "false"):
        return _script_value(p, False)
    if isinstance(result, str) and result.startswith("{"):
        try:
            parsed = json_parse(result)
        except ValueError as err:
            raise python_runner.ScriptError(f"Invalid JSON: {err} when parsing result: {result}") from None
        if not isinstance(parsed, dict):
            raise python_runner.ScriptError(
                "Python assertion must return a boolean, number, or {pass, score, reason} object. "
                f"Got instead: {result}"
            )
        return _script_object(p, parsed)
    if isinstance(result, dict):
        return _script_object(p, result)
    if isinstance(result, list):  # an object to JavaScript, and not a grading result
        shown = json.dumps({str(i): v for i, v in enumerate(result)}, indent=2, ensure_ascii=False)
        raise python_runner.ScriptError(
            f"Python assertion must return a boolean, number, or {{pass, score, reason}} object. Got instead:\n{shown}"
        )
    is_number = isinstance(result, (int, float)) and not isinstance(result, bool)
    score = result if is_number else js_parse_float(js_string(result))
    if math.isnan(score):
        raise python_runner.ScriptError(
            "Python assertion must return a boolean, number, or {pass, score, reason} object. "
            f"Instead got:\n{js_string(result)}"
        )
    return _script_value(p, float(score))


def _script_value(p: _Params, result: bool | float) -> Grade:
    suffix = f"\n{p.assertion.value}" if isinstance(p.assertion.value, str) and p.assertion.value else ""
    if isinstance(result, bool):
        passed = result != p.inverse
        return {"pass": passed, "score": 1.0 if passed else 0.0,
                "reason": "Assertion passed" if passed
                          else f"Python code returned {'true' if result else 'false'}{suffix}"}
    threshold = p.assertion.threshold
    raw = result > 0 if threshold is None else result >= threshold
    passed = raw != p.inverse
    return {"pass": passed, "score": result,
            "reason": "Assertion passed" if passed else f"Python code returned {'true' if raw else 'false'}{suffix}"}


def _script_object(p: _Params, obj: dict[str, Any]) -> Grade:
    obj = {_camel(k): v for k, v in obj.items()}
    score = obj.get("score")
    if not (isinstance(obj.get("pass"), bool) and isinstance(score, (int, float)) and not isinstance(score, bool)
            and isinstance(obj.get("reason"), str)):
        raise python_runner.ScriptError(
            "Python assertion must return a boolean, number, or {pass, score, reason} object. Got instead:\n"
            + json_stringify(obj)
        )
    grade = {"pass": obj["pass"], "score": float(score), "reason": obj["reason"]}
    threshold = p.assertion.threshold
    if threshold is not None and grade["score"] < threshold:
        grade["pass"] = False
        message = f"Python score {js_number(grade['score'])} is less than threshold {js_number(threshold)}"
        grade["reason"] = f"{message}: {grade['reason']}" if grade["reason"] else message
    passed = grade["pass"] != p.inverse
    if passed == grade["pass"]:
        reason = grade["reason"]
    else:
        reason = "Assertion passed" if passed else f"Python code returned {'true' if grade['pass'] else 'false'}"
    if isinstance(obj.get("namedScores"), dict):
        grade["namedScores"] = obj["namedScores"]
    return dict(grade, **{"pass": passed, "reason": reason})


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


# -- trajectories ------------------------------------------------------------------------------


def _steps(p: _Params) -> list[tuple[str, str, dict[str, Any]]]:
    """(type, name, args) per rollout step: tool calls are "tool", the terminate is "message"."""
    if p.case.steps is None:
        raise MissingEvidence(f"No trace data available for {p.base_type} assertion (pass steps=)")
    out = []
    for step in p.case.steps:
        step = step if isinstance(step, TrajectoryStep) else TrajectoryStep.model_validate(step)
        out.append(("tool", step.tool, step.args) if step.tool else ("message", "terminate", {}))
    return out


def _matcher(value: Any) -> dict[str, Any]:
    return {"pattern": value, "type": "tool"} if isinstance(value, str) else dict(value, type=value.get("type", "tool"))


def _matches(step: tuple[str, str, dict[str, Any]], matcher: dict[str, Any]) -> bool:
    kind, name, _ = step
    wanted = matcher.get("type")
    if wanted and kind not in (wanted if isinstance(wanted, list) else [wanted]):
        return False
    pattern = matcher.get("pattern") or matcher.get("name")
    if not pattern:
        return True
    return fnmatch.fnmatchcase(name.lower(), str(pattern).lower().replace("[", "[[]"))


def _label(matcher: dict[str, Any]) -> str:
    return str(matcher.get("pattern") or matcher.get("name") or "*")


def _tool_used(p: _Params) -> Grade:
    tools = [s for s in _steps(p) if s[0] == "tool"]
    value = p.value
    actual = ", ".join(f"tool:{s[1]}" for s in tools) or "(none)"
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        matchers = [_matcher(v) for v in ([value] if isinstance(value, str) else value)]
        _require(matchers, "trajectory:tool-used assertion requires at least one expected tool")
        missing = [m for m in matchers if not any(_matches(s, m) for s in tools)]
        matched = [m for m in matchers if any(_matches(s, m) for s in tools)]
        passed = (not matched) if p.inverse else (not missing)
        if p.inverse:
            reason = (f"Forbidden tool(s) were not used: {', '.join(map(_label, matchers))}" if passed
                      else f"Forbidden tool(s) were used: {', '.join(map(_label, matched))}. Actual tools: {actual}")
        elif passed:
            reason = f"Observed required tool(s): {', '.join(map(_label, matchers))}. Actual tools: {actual}"
        else:
            reason = f"Missing required tool(s): {', '.join(map(_label, missing))}. Actual tools: {actual}"
        return {"pass": passed, "score": 1.0 if passed else 0.0, "reason": reason}
    if not isinstance(value, dict):
        raise InvalidAssertion("trajectory:tool-used assertion must have a string, string array, or object value")
    matcher = _matcher(value)
    _require(matcher.get("pattern") or matcher.get("name"),
             "trajectory:tool-used assertion object must include a name or pattern property")
    given_min, given_max = value.get("min"), value.get("max")
    low = given_min if isinstance(given_min, (int, float)) else 1
    high = given_max if isinstance(given_max, (int, float)) else None
    count = sum(_matches(s, matcher) for s in tools)
    base = count >= low and (high is None or count <= high)
    passed = base != p.inverse
    expected = f"at least {js_number(low)}" if high is None else f"{js_number(low)}-{js_number(high)}"
    return {"pass": passed, "score": 1.0 if passed else 0.0,
            "reason": f'Matched tool "{_label(matcher)}" {count} time(s) (expected {expected})'}


def _tool_sequence(p: _Params) -> Grade:
    value = p.value
    if isinstance(value, list):
        mode, steps = "in_order", value
    elif isinstance(value, dict):
        mode, steps = value.get("mode") or "in_order", value.get("steps") or []
    else:
        raise InvalidAssertion("trajectory:tool-sequence assertion must have an array or object value")
    matchers = [_matcher(s) for s in steps]
    for i, m in enumerate(matchers):
        _require(m.get("pattern") or m.get("name"),
                 f"trajectory:tool-sequence assertion step {i + 1} must include a name or pattern property")
    _require(matchers, "trajectory:tool-sequence assertion requires at least one expected step")
    tools = [s for s in _steps(p) if s[0] == "tool"]
    actual = ", ".join(f"tool:{s[1]}" for s in tools) or "(none)"
    if mode == "exact":
        base = len(tools) == len(matchers) and all(_matches(t, m) for t, m in zip(tools, matchers, strict=True))
    else:
        at = 0
        for step in tools:
            if at < len(matchers) and _matches(step, matchers[at]):
                at += 1
        base = at == len(matchers)
    passed = base != p.inverse
    return {"pass": passed, "score": 1.0 if passed else 0.0,
            "reason": f"{'Observed' if base else 'Did not observe'} tool sequence "
                      f"{', '.join(map(_label, matchers))}. Actual tools: {actual}"}


def _args_match(actual: Any, expected: Any, mode: str) -> bool:
    if mode == "exact":
        return deep_strict_equal(actual, expected)
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and all(
            _args_match(a, e, mode) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and _args_match(actual[k], v, mode) for k, v in expected.items()
        )
    return deep_strict_equal(actual, expected)


def _tool_args_match(p: _Params) -> Grade:
    value = p.value
    _require(isinstance(value, dict), "trajectory:tool-args-match assertion must have an object value")
    matcher = _matcher(value)
    _require(matcher.get("pattern") or matcher.get("name"),
             "trajectory:tool-args-match assertion object must include a name or pattern property")
    expected = value.get("args", value.get("arguments"))
    _require(expected is not None or "args" in value or "arguments" in value,
             "trajectory:tool-args-match assertion must include an args or arguments property")
    mode = value.get("mode") or "partial"
    _require(mode in ("partial", "exact"), 'trajectory:tool-args-match assertion mode must be "partial" or "exact"')
    ignore = value.get("ignore") or []
    ignore = [ignore] if isinstance(ignore, str) else ignore
    defaults = value.get("defaults") or {}

    def clean(args: Any, strip_defaults: bool) -> Any:
        if not isinstance(args, dict):
            return args
        kept = {k: v for k, v in args.items()
                if not any(k == i or fnmatch.fnmatchcase(k.lower(), i.lower()) for i in ignore)}
        if strip_defaults:
            kept = {k: v for k, v in kept.items() if not (k in defaults and deep_strict_equal(v, defaults[k]))}
        return kept

    candidates = [s for s in _steps(p) if s[0] == "tool" and _matches(s, matcher)]
    hit = any(_args_match(clean(s[2], True), clean(expected, False), mode) for s in candidates)
    passed = hit != p.inverse
    return {"pass": passed, "score": 1.0 if passed else 0.0,
            "reason": f'{"Found" if hit else "No"} call of "{_label(matcher)}" with matching arguments '
                      f"({len(candidates)} call(s) of it)"}


def _step_count(p: _Params) -> Grade:
    value = p.value if isinstance(p.value, dict) else {}
    low, high = value.get("min"), value.get("max")
    _require(low is not None or high is not None, "trajectory:step-count assertion must include a min or max property")
    matcher = {k: value[k] for k in ("type", "pattern", "name") if k in value}
    count = sum(_matches(s, matcher) for s in _steps(p))
    base = (low is None or count >= low) and (high is None or count <= high)
    passed = base != p.inverse
    return {"pass": passed, "score": 1.0 if passed else 0.0, "reason": f"Matched {count} trajectory step(s)"}


HANDLERS: dict[str, Callable[[_Params], Grade]] = {
    "equals": _equals,
    "contains": _contains,
    "icontains": _contains,
    "contains-any": _contains_any_all,
    "contains-all": _contains_any_all,
    "icontains-any": _contains_any_all,
    "icontains-all": _contains_any_all,
    "starts-with": _starts_with,
    "regex": _regex,
    "is-json": _is_json,
    "contains-json": _contains_json,
    "levenshtein": _levenshtein,
    "rouge-n": _rouge_n,
    "bleu": _bleu,
    "latency": _latency,
    "cost": _cost,
    "python": _python,
    "trajectory:tool-used": _tool_used,
    "trajectory:tool-sequence": _tool_sequence,
    "trajectory:tool-args-match": _tool_args_match,
    "trajectory:step-count": _step_count,
}
TRAJECTORY_TYPES = frozenset(t for t in HANDLERS if t.startswith("trajectory:"))
MEASURED_TYPES = frozenset({"latency", "cost"})


def base_type(assertion_type: str) -> str:
    return assertion_type.removeprefix("not-")


def native_problem(assertion: Assertion) -> str | None:
    """Why the native backend cannot grade ``assertion`` (or None if it can)."""
    if assertion.type == "assert-set":
        for child in assertion.assert_ or []:
            problem = native_problem(child)
            if problem:
                return problem
        return None
    kind = base_type(assertion.type)
    if kind not in HANDLERS:
        return kind
    if assertion.transform:
        return f"{kind} with a transform"
    value = assertion.value
    if isinstance(value, str):
        strings = [value]
    else:
        strings = [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
    if kind != "python" and any(s.startswith("file://") for s in strings):
        return f"{kind} with a file:// value"
    return None


def _truthy(value: Any) -> bool:
    """JavaScript truthiness for JSON-like values (``[]`` and ``{}`` are truthy)."""
    if value is None or value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0 and not math.isnan(value)
    if isinstance(value, str):
        return value != ""
    return True


# -- aggregation (promptfoo's AssertionsResult) ------------------------------------------------


class _Aggregate:
    def __init__(self, threshold: float | None) -> None:
        self.threshold = threshold
        self.total_score = 0.0
        self.total_weight = 0.0
        self.failed_reason: str | None = None
        self.components: dict[int, Grade] = {}
        self.named: dict[str, float] = {}
        self.named_weights: dict[str, float] = {}

    def add(self, index: int, result: Grade, metric: str | None, weight: float | None) -> None:
        weight = 1.0 if weight is None else weight
        self.total_score += result["score"] * weight
        self.total_weight += weight
        self.components[index] = result
        if metric:
            self.named[metric] = self.named.get(metric, 0.0) + result["score"] * weight
            self.named_weights[metric] = self.named_weights.get(metric, 0.0) + weight
        for name, score in (result.get("namedScores") or {}).items():
            if name != metric:
                incoming = (result.get("namedScoreWeights") or {}).get(name, 1) * weight
                self.named[name] = self.named.get(name, 0.0) + score * incoming
                self.named_weights[name] = self.named_weights.get(name, 0.0) + incoming
        if not result["pass"]:
            self.failed_reason = result["reason"]

    def result(self) -> Grade:
        score = self.total_score / self.total_weight if self.total_weight > 0 else 0.0
        passed = self.failed_reason is None
        reason = self.failed_reason or "All assertions passed"
        if self.threshold is not None and not math.isnan(self.threshold):
            passed = score >= self.threshold
            reason = (f"Aggregate score {_to_fixed2(score)} {'≥' if passed else '<'} "
                      f"{js_number(self.threshold)} threshold")
        flattened: list[Grade] = []
        for index in sorted(self.components):
            component = self.components[index]
            flattened.append(component)
            for child in component.get("componentResults", []):
                flattened.append(dict(child, assertion=child.get("assertion") or component.get("assertion")))
        named = {k: (v / self.named_weights[k] if self.named_weights.get(k) else 0.0) for k, v in self.named.items()}
        out: Grade = {"pass": passed, "score": score, "reason": reason, "namedScores": named,
                      "componentResults": flattened}
        if self.named_weights:
            out["namedScoreWeights"] = dict(self.named_weights)
        return out


def _to_fixed2(x: float) -> str:
    """``Number.prototype.toFixed(2)`` (round half away from zero on the decimal value)."""
    from decimal import ROUND_HALF_UP, Decimal

    return str(Decimal(repr(x)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def _run_one(assertion: Assertion, case: EvalCase, output: str, path: str) -> Grade:
    kind = base_type(assertion.type)
    params = _Params(
        assertion=assertion,
        base_type=kind,
        inverse=assertion.type.startswith("not-"),
        output=output,
        value=assertion.value,
        value_given="value" in assertion.model_fields_set,
        case=case,
    )
    try:
        grade = HANDLERS[kind](params)
    except InvalidAssertion as err:
        err.path = path
        raise
    grade["assertion"] = assertion.to_config()
    if assertion.weight == 0:
        grade["pass"] = True
    return grade


@dataclass
class NativeGrade:
    """What the native evaluator made of one rollout.

    ``grade`` is promptfoo's GradingResult shape (``pass``, ``score``, ``reason``, ``namedScores``,
    ``componentResults``); for an ERROR it is None and ``error`` says why, ``status`` says what kind
    (``invalid_input`` or ``missing_evidence``) and ``errored_path`` which assertion (if known).
    """

    grade: dict[str, Any] | None
    error: str | None = None
    status: str = "succeeded"
    errored_path: str | None = None


def check_native(case: EvalCase) -> None:
    """Raise if the native backend lacks a type (or form) of ``case``'s assertions.

    Raises:
        UnsupportedAssertionError: it names the type.
    """
    for assertion in case.assertions:
        problem = native_problem(assertion)
        if problem:
            raise UnsupportedAssertionError(
                f"the native backend cannot grade {problem!r}; use backend='cli' (or 'auto' with "
                "the promptfoo CLI installed)",
                problem,
            )


def grade_native(case: EvalCase) -> NativeGrade:
    """Grade one case natively.

    Raises:
        UnsupportedAssertionError: an assertion type (or form) the native backend lacks.
    """
    check_native(case)
    output = coerce_output(case.final_output)
    problem = config_problem(case)
    if problem and "$ref" in problem:  # promptfoo refuses the config before grading anything
        path = problem.split(" ", 1)[0]
        return NativeGrade(None, error=f"promptfoo rejects the config: {problem} (it dereferences $refs against "
                           "the whole config)", status="invalid_input", errored_path=path)
    if not case.assertions:
        return NativeGrade({"pass": True, "score": 1.0, "reason": "No assertions", "namedScores": {},
                            "componentResults": []})
    try:
        main = _Aggregate(case.threshold)
        sets: list[tuple[int, Assertion, _Aggregate]] = []
        for index, assertion in enumerate(case.assertions):
            if assertion.type == "assert-set":
                children = assertion.assert_
                if not isinstance(children, list):
                    raise _at(InvalidAssertion("assert-set must have an assert list"), f"assert[{index}]")
                inner = _Aggregate(assertion.threshold)
                for j, child in enumerate(children):
                    if child.type == "assert-set":
                        raise _at(InvalidAssertion("assert-set cannot contain another assert-set"),
                                  f"assert[{index}].assert[{j}]")
                    inner.add(j, _run_one(child, case, output, f"assert[{index}].assert[{j}]"),
                              child.metric, child.weight)
                sets.append((index, assertion, inner))
            else:
                main.add(index, _run_one(assertion, case, output, f"assert[{index}]"),
                         assertion.metric, assertion.weight)
        for index, assertion, inner in sets:
            set_result = inner.result()
            set_result["assertion"] = assertion.to_config()
            main.add(index, set_result, assertion.metric, assertion.weight)
        final = main.result()
    except InvalidAssertion as err:
        return NativeGrade(None, error=str(err), status=err.status, errored_path=getattr(err, "path", None))
    return NativeGrade(final)


def _at(err: InvalidAssertion, path: str) -> InvalidAssertion:
    err.path = path
    return err
