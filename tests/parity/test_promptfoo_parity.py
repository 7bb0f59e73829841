"""Parity: the native backend and the real promptfoo CLI agree on pass, score and ERROR vs FAIL.

All cases go through one ``promptfoo eval`` run (the batch path) and through the native backend;
each case is then its own test. Latency, cost and trajectory assertions are left out: the CLI
cannot grade those from a rollout (it measures latency itself and reads trajectories from spans).
"""

from __future__ import annotations

import asyncio
import os

import pytest

from softprobe.promptfoo_adapter import EvalCase, grade_cases, validate_framework_result
from softprobe.promptfoo_adapter.cli_backend import find_cli

pytestmark = pytest.mark.promptfoo

A = dict  # an assertion

CASES: list[tuple[str, str, list[dict], float | None]] = []


def case(name: str, output: str, assertions: list[dict], threshold: float | None = None) -> None:
    CASES.append((name, output, assertions, threshold))


# contains / icontains, numbers printed the JavaScript way
for value, output in [(1.0, "total: 1"), (1.0, "total: 1.0"), (0.1, "x 0.1"), (1e21, "1e+21"), (1.5e-7, "1.5e-7"),
                      (0.00001, "0.00001"), (100, "100"), (0, "0 items"), (-2.5, "-2.5")]:
    case(f"contains-number-{value!r}-{output}", output, [A(type="contains", value=value)])
case("contains-plain", "Refund for A-42", [A(type="contains", value="A-42")])
case("contains-miss", "Refund for A-4", [A(type="contains", value="A-42")])
case("not-contains", "Refund for A-42", [A(type="not-contains", value="A-43")])
case("contains-empty-is-error", "anything", [A(type="contains", value="")])
case("contains-object-is-error", "anything", [A(type="contains", value={"a": 1})])
case("contains-missing-value-is-error", "anything", [A(type="contains")])
case("contains-bool-is-error", "true", [A(type="contains", value=True)])
case("icontains", "REFUND Note", [A(type="icontains", value="refund note")])
case("icontains-unicode", "STRASSE und Straße", [A(type="icontains", value="straße")])
case("not-icontains", "Hello", [A(type="not-icontains", value="HELLO")])
case("contains-template-text", "Agent wrote {{ secret }} and {% raw %}", [A(type="contains", value="{{ secret }}")])
case("contains-template-in-output-only", "{{ 7*7 }} {% if x %}", [A(type="contains", value="7*7")])

# contains-any / contains-all: CSV-style splitting
case("any-csv", "apple pie", [A(type="contains-any", value="banana, apple ,cherry")])
case("any-quoted-comma", "it costs 1,000 dollars", [A(type="contains-any", value='"1,000", "2,000"')])
case("any-quoted-escape", 'say "hi"', [A(type="contains-any", value='"say \\"hi\\""')])
case("any-doubled-quote", 'say "hi"', [A(type="contains-any", value='"say ""hi"""')])
case("any-empty-fields", "b", [A(type="contains-any", value=" , ,a,, b ,")])
case("any-unterminated-is-error", "x", [A(type="contains-any", value='"abc, d')])
case("any-text-after-quote-is-error", "x", [A(type="contains-any", value='"a" b, c')])
case("any-array", "7 apples", [A(type="contains-any", value=[7, "pears"])])
case("any-empty-array-fails", "x", [A(type="contains-any", value=[])])
case("any-number-is-error", "5", [A(type="contains-any", value=5)])
case("any-zero-is-error", "0", [A(type="contains-any", value=0)])
case("all-pass", "red green blue", [A(type="contains-all", value="red,green")])
case("all-miss", "red green", [A(type="contains-all", value=["red", "blue"])])
case("all-empty-array-passes", "x", [A(type="contains-all", value=[])])
case("not-all", "red green", [A(type="not-contains-all", value=["red", "blue"])])
case("icontains-any", "HELLO", [A(type="icontains-any", value="world, hello")])
case("icontains-all", "Alpha BETA", [A(type="icontains-all", value=["alpha", "beta"])])
case("not-icontains-any", "HELLO", [A(type="not-icontains-any", value=["hello"])])

# equals
case("equals-exact", "done", [A(type="equals", value="done")])
case("equals-whitespace", "done\n", [A(type="equals", value="done")])
case("equals-case", "Done", [A(type="equals", value="done")])
case("equals-number", "42", [A(type="equals", value=42)])
case("equals-float-js", "1", [A(type="equals", value=1.0)])
case("equals-object", '{"b": 2, "a": 1}', [A(type="equals", value={"a": 1, "b": 2})])
case("equals-object-float", '{"a": 1.0}', [A(type="equals", value={"a": 1})])
case("equals-bool-vs-number", '{"a": 1}', [A(type="equals", value={"a": True})])
case("equals-array", "[1, 2, 3]", [A(type="equals", value=[1, 2, 3])])
case("equals-array-order", "[1, 3, 2]", [A(type="equals", value=[1, 2, 3])])
case("equals-object-not-json", "not json", [A(type="equals", value={"a": 1})])
case("not-equals-object-not-json", "not json", [A(type="not-equals", value={"a": 1})])
case("not-equals", "x", [A(type="not-equals", value="y")])
case("equals-null", "null", [A(type="equals", value=None)])

# starts-with
case("starts-with", "Hello world", [A(type="starts-with", value="Hello")])
case("starts-with-miss", " Hello", [A(type="starts-with", value="Hello")])
case("not-starts-with", "Hello", [A(type="not-starts-with", value="Bye")])
case("starts-with-empty-is-error", "x", [A(type="starts-with", value="")])
case("starts-with-number-is-error", "1x", [A(type="starts-with", value=1)])

# regex: ECMAScript, not Python
case("regex-basic", "order 123", [A(type="regex", value=r"\d+")])
case("regex-dollar-trailing-newline", "abc\n", [A(type="regex", value="abc$")])
case("regex-unicode-digit", "٣", [A(type="regex", value=r"^\d$")])
case("regex-unicode-word", "é", [A(type="regex", value=r"^\w$")])
case("regex-inline-flag-fails", "x", [A(type="regex", value="(?i)X")])
case("not-regex-invalid-still-fails", "x", [A(type="not-regex", value="(?i)X")])
case("regex-lookbehind", "price: $5", [A(type="regex", value=r"(?<=\$)\d")])
case("regex-named-group", "ab", [A(type="regex", value=r"(?<first>a)b")])
case("regex-caret-no-multiline", "x\nfoo", [A(type="regex", value="^foo")])
case("regex-backslash-p-no-u", "p{L}", [A(type="regex", value=r"^\p{L}$")])
case("regex-search-anywhere", "xxabcxx", [A(type="regex", value="abc")])
case("not-regex", "abc", [A(type="not-regex", value="^z")])
case("regex-empty-is-error", "x", [A(type="regex", value="")])

# is-json / contains-json
case("is-json", '{"a": [1, 2]}', [A(type="is-json")])
case("is-json-nan", "NaN", [A(type="is-json")])
case("is-json-trailing-comma", '{"a": 1,}', [A(type="is-json")])
case("is-json-scalar", "42", [A(type="is-json")])
case("is-json-schema-ok", '{"id": "A-42"}', [A(type="is-json", value={"type": "object", "required": ["id"]})])
case("is-json-schema-fail", '{"id": 42}', [A(type="is-json", value={"type": "object", "properties": {"id": {"type": "string"}}})])
case("is-json-yaml-schema", '{"n": 3}', [A(type="is-json", value="type: object\nproperties:\n  n: {type: integer, minimum: 5}\n")])
case("not-is-json", "plain", [A(type="not-is-json")])
case("is-json-number-value-is-error", "{}", [A(type="is-json", value=7)])
case("contains-json", 'Result: {"ok": true} done', [A(type="contains-json")])
case("contains-json-none", "no braces here", [A(type="contains-json")])
case("contains-json-schema", 'a {"x": 1} b {"y": "s"}', [A(type="contains-json", value={"required": ["y"]})])
case("not-contains-json", "plain text", [A(type="not-contains-json")])

# levenshtein counts UTF-16 code units
case("lev-close", "kitten", [A(type="levenshtein", value="sitting")])
case("lev-far", "kitten", [A(type="levenshtein", value="sitting", threshold=2)])
case("lev-emoji", "😀", [A(type="levenshtein", value="", threshold=1)])
case("lev-emoji-2", "😀", [A(type="levenshtein", value="", threshold=2)])
case("not-lev", "abc", [A(type="not-levenshtein", value="abd", threshold=0)])
case("lev-number-is-error", "1", [A(type="levenshtein", value=1)])

# rouge-n, bleu: scores, and 1 - score under not-
case("rouge-same", "The cat sat on the mat", [A(type="rouge-n", value="the cat sat on the mat")])
case("rouge-partial", "the cat", [A(type="rouge-n", value="the cat sat on the mat")])
case("rouge-punct", "Hello, world! It's fine.", [A(type="rouge-n", value="hello world it is fine", threshold=0.3)])
case("not-rouge", "the cat", [A(type="not-rouge-n", value="the cat sat on the mat")])
case("rouge-number-is-error", "x", [A(type="rouge-n", value=3)])
case("bleu-same", "the cat sat on the mat", [A(type="bleu", value="the cat sat on the mat")])
case("bleu-short", "the cat", [A(type="bleu", value="the cat sat on the mat")])
case("bleu-refs", "a b c d e", [A(type="bleu", value=["a b c d x", "a b c d e f"])])
case("not-bleu", "the cat", [A(type="not-bleu", value="the cat sat on the mat")])
case("bleu-number-is-error", "x", [A(type="bleu", value=5)])

# python
case("python-bool", "hello", [A(type="python", value="output.startswith('he')")])
case("python-false", "hello", [A(type="python", value="len(output) > 10")])
case("python-number", "abc", [A(type="python", value="len(output) / 10")])
case("python-number-threshold", "abc", [A(type="python", value="len(output) / 10", threshold=0.5)])
case("python-dict", "abc", [A(type="python", value="{'pass': True, 'score': 0.25, 'reason': 'partial'}")])
case("python-multiline", "a,b,c", [A(type="python", value="parts = output.split(',')\nreturn len(parts) == 3")])
case("python-raises", "x", [A(type="python", value="1/0")])
case("python-none", "x", [A(type="python", value="None")])
case("python-string-true", "x", [A(type="python", value="'true'")])
case("not-python", "x", [A(type="not-python", value="output == 'x'")])

# weights, metrics, thresholds, sets
case("weights", "abc", [A(type="contains", value="a", weight=3), A(type="contains", value="z", weight=1)])
case("weight-zero-forced-pass", "abc", [A(type="contains", value="z", weight=0), A(type="contains", value="a")])
case("all-weights-zero", "abc", [A(type="contains", value="z", weight=0)])
case("threshold-met", "abc", [A(type="contains", value="a"), A(type="contains", value="z")], 0.5)
case("threshold-missed", "abc", [A(type="contains", value="a"), A(type="contains", value="z"), A(type="contains", value="y")], 0.5)
case("threshold-zero", "abc", [A(type="contains", value="z")], 0.0)
case("metrics", "abc", [A(type="contains", value="a", metric="m"), A(type="contains", value="z", metric="m")])
case("set-threshold", "abc", [A(type="assert-set", threshold=0.5, assert_=[A(type="contains", value="a"), A(type="contains", value="z")])])
case("set-fails", "abc", [A(type="assert-set", assert_=[A(type="contains", value="a"), A(type="contains", value="z")])])
case("set-weighted", "abc", [A(type="contains", value="a"), A(type="assert-set", weight=3, assert_=[A(type="contains", value="z"), A(type="contains", value="b")])])
case("set-error-inside", "abc", [A(type="assert-set", assert_=[A(type="contains", value="")])])
case("no-assertions", "abc", [])
case("mixed-error-and-fail", "abc", [A(type="contains", value="z"), A(type="starts-with", value="")])


# ---- Edges where JavaScript's meaning differs from Python's (issue 22) ----------------------------
# 1. whitespace: JS \s and trim() include U+FEFF and exclude U+0085 and U+001C-U+001F
case("ws-any-bom-trimmed", "apple", [A(type="contains-any", value="\ufeffapple\ufeff, pear")])
case("ws-any-nel-kept", "apple", [A(type="contains-any", value="\x85apple\x85")])
case("ws-any-nel-kept-present", "\x85apple\x85", [A(type="contains-all", value="\x85apple\x85,pear\x1c")])
case("ws-all-unit-sep-kept", "a b", [A(type="contains-all", value="\x1fa, b")])
case("ws-any-nbsp-trimmed", "kiwi", [A(type="contains-any", value="\xa0kiwi\u3000")])
case("ws-quoted-then-bom-comma", "x", [A(type="contains-any", value='"x"\ufeff, "y"')])
case("ws-quoted-then-nel-is-error", "x", [A(type="contains-any", value='"x"\x85, "y"')])
case("ws-bleu-bom-split", "the\ufeffcat sat on the mat", [A(type="bleu", value="the cat sat on the mat")])
case("ws-bleu-nel-not-split", "the\x85cat sat on the mat", [A(type="bleu", value="the cat sat on the mat", threshold=0.9)])
case("ws-bleu-only-bom-is-empty", "\ufeff\ufeff", [A(type="bleu", value="a")])
case("ws-bleu-file-sep-is-a-word", "\x1c", [A(type="bleu", value="a", threshold=0)])
case("ws-rouge-bom", "\ufeffthe cat\ufeff", [A(type="rouge-n", value="the cat")])
case("ws-rouge-record-sep", "the\x1ecat", [A(type="rouge-n", value="the cat", threshold=0.1)])
case("ws-rouge-nel", "the\x85cat", [A(type="rouge-n", value="the cat")])
case("ws-regex-s-bom", "\ufeff", [A(type="regex", value=r"^\s$")])
case("ws-regex-s-nel", "\x85", [A(type="regex", value=r"^\s$")])
case("ws-python-float-bom", "x", [A(type="python", value="'\\ufeff0.5'")])
case("ws-python-float-nel", "x", [A(type="python", value="'\\x850.5'")])

# 2. deep equality is util.isDeepStrictEqual: -0 is not 0
case("eq-minus-zero-array", "[-0]", [A(type="equals", value=[0])])
case("eq-minus-zero-float", "[-0.0]", [A(type="equals", value=[0.0])])
case("eq-minus-zero-both", "[-0]", [A(type="equals", value=[-0.0])])
case("eq-minus-zero-object", '{"a": -0}', [A(type="equals", value={"a": 0})])
case("eq-zero-exponent", "[0e5]", [A(type="equals", value=[0])])
case("eq-big-int-rounds", "[12345678901234567890]", [A(type="equals", value=[12345678901234567000])])
case("eq-float-int", "[1.0, 2.50]", [A(type="equals", value=[1, 2.5])])
case("eq-null-in-array", "[null]", [A(type="equals", value=[None])])
case("not-eq-minus-zero", "[-0]", [A(type="not-equals", value=[0])])

# 3. regex without the u flag, Node 20 syntax
case("re-emoji-two-units", "😀", [A(type="regex", value="^.$")])
case("re-emoji-two-dots", "😀", [A(type="regex", value="^..$")])
case("re-high-surrogate-escape", "😀", [A(type="regex", value=r"^\uD83D")])
case("re-low-surrogate-escape", "😀", [A(type="regex", value=r"\uDE00$")])
case("re-emoji-class-is-two-units", "😀", [A(type="regex", value="^[😀]$")])
case("re-emoji-quantifier-low-half", "😀😀", [A(type="regex", value="^😀+$")])
case("re-u-brace-not-codepoint", "😀", [A(type="regex", value=r"\u{1F600}")])
case("re-u-brace-is-quantifier", "uu", [A(type="regex", value=r"^\u{2}$")])
case("re-inline-modifier-invalid", "A", [A(type="regex", value="(?i:a)")])
case("re-duplicate-names-invalid", "b", [A(type="regex", value="(?<n>a)|(?<n>b)")])
case("not-re-duplicate-names-fails", "b", [A(type="not-regex", value="(?<n>a)|(?<n>b)")])
case("re-negated-class-astral", "😀", [A(type="regex", value="^[^a][^a]$")])
case("re-bmp-range-covers-surrogates", "😀", [A(type="regex", value=r"^[\u0000-\uFFFF]{2}$")])
case("re-lone-brace-literal", "a{", [A(type="regex", value="a{")])
case("re-quantifier-order-invalid", "x", [A(type="regex", value="x{2,1}")])

# 4. JSON Schema as Ajv strict + ajv-formats, draft-07
case("schema-unknown-keyword", '{"a": 1}', [A(type="is-json", value={"type": "object", "foo": 1})])
case("schema-unknown-keyword-nested", '{"a": 1}', [A(type="is-json", value={"properties": {"a": {"minimun": 1}}})])
case("schema-unknown-keyword-not-json", "x", [A(type="is-json", value={"type": "object", "foo": 1})])
case("schema-format-email-bad", '{"a": "x"}', [A(type="is-json", value={"properties": {"a": {"format": "email"}}})])
case("schema-format-email-ok", '{"a": "x@y.co"}', [A(type="is-json", value={"properties": {"a": {"format": "email"}}})])
case("schema-format-date-time-bad", '{"a": "2024-13-01T00:00:00Z"}', [A(type="is-json", value={"properties": {"a": {"format": "date-time"}}})])
case("schema-format-date-time-no-tz", '{"a": "2024-12-01T00:00:00"}', [A(type="is-json", value={"properties": {"a": {"format": "date-time"}}})])
case("schema-format-date-leap", '{"a": "2024-02-29"}', [A(type="is-json", value={"properties": {"a": {"format": "date"}}})])
case("schema-format-date-not-leap", '{"a": "2023-02-29"}', [A(type="is-json", value={"properties": {"a": {"format": "date"}}})])
case("schema-format-uuid", '{"a": "123e4567-e89b-12d3-a456-426614174000"}', [A(type="is-json", value={"properties": {"a": {"format": "uuid"}}})])
case("schema-format-ipv4-bad", '{"a": "256.1.1.1"}', [A(type="is-json", value={"properties": {"a": {"format": "ipv4"}}})])
case("schema-format-uri-relative", '{"a": "foo/bar"}', [A(type="is-json", value={"properties": {"a": {"format": "uri"}}})])
case("schema-format-int32", '{"a": 3000000000}', [A(type="is-json", value={"properties": {"a": {"format": "int32"}}})])
case("schema-format-unknown", '{"a": "x"}', [A(type="is-json", value={"properties": {"a": {"format": "colour"}}})])
case("schema-draft-04", "{}", [A(type="is-json", value={"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"})])
case("schema-draft-2020", "{}", [A(type="is-json", value={"$schema": "https://json-schema.org/draft/2020-12/schema"})])
case("schema-draft-07-ok", "{}", [A(type="is-json", value={"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"})])
case("schema-nullable", '{"a": null}', [A(type="is-json", value={"properties": {"a": {"type": "string", "nullable": True}}})])
case("schema-nullable-false", '{"a": null}', [A(type="is-json", value={"properties": {"a": {"type": "string", "nullable": False}}})])
case("schema-nullable-without-type", '{"a": 1}', [A(type="is-json", value={"properties": {"a": {"nullable": True}}})])
case("schema-pattern-ascii-digit", '{"a": "٣"}', [A(type="is-json", value={"properties": {"a": {"pattern": r"^\d$"}}})])
case("schema-pattern-p-letter", '{"a": "é"}', [A(type="is-json", value={"properties": {"a": {"pattern": r"^\p{L}$"}}})])
case("schema-pattern-astral-one-char", '{"a": "😀"}', [A(type="is-json", value={"properties": {"a": {"pattern": "^.$"}}})])
case("schema-pattern-invalid-u", '{"a": "x"}', [A(type="is-json", value={"properties": {"a": {"pattern": r"\-"}}})])
case("schema-pattern-properties-u", '{"é": 1}', [A(type="is-json", value={"patternProperties": {r"^\p{L}$": {"type": "string"}}})])
case("schema-metadata-keywords", '{"a": 1}', [A(type="is-json", value={"title": "t", "description": "d", "$comment": "c", "examples": [1], "default": {}, "readOnly": True})])
case("schema-contains-json-format", 'see {"mail": "x@y.co"} and {"mail": "nope"}', [A(type="contains-json", value={"required": ["mail"], "properties": {"mail": {"format": "email"}}})])

# 5. YAML 1.2 (js-yaml core schema)
case("yaml-no-is-string", '{"a": 1}', [A(type="is-json", value="properties:\n  a: {type: integer}\nadditionalProperties: no\n")])
case("yaml-yes-in-candidate", "{a: yes}", [A(type="contains-json", value={"properties": {"a": {"type": "string"}}})])
case("yaml-on-in-candidate", "{a: on}", [A(type="contains-json", value={"properties": {"a": {"type": "boolean"}}})])
case("yaml-true-in-candidate", "{a: True}", [A(type="contains-json", value={"properties": {"a": {"type": "boolean"}}})])
case("yaml-underscore-int-is-string", "{a: 1_000}", [A(type="contains-json", value={"properties": {"a": {"type": "string"}}})])
case("yaml-hex-int", "{a: 0x1F}", [A(type="contains-json", value={"properties": {"a": {"const": 31}}})])
case("yaml-duplicate-key-last-wins", '{"a": 1, "a": 2}', [A(type="contains-json", value={"properties": {"a": {"const": 2}}})])
case("yaml-schema-duplicate-key-error", "{}", [A(type="is-json", value="type: object\ntype: array\n")])
case("yaml-schema-off-enum", '{"a": "off"}', [A(type="is-json", value="properties:\n  a: {enum: [off]}\n")])

# 6. JSON parsing: numbers are doubles of any length; NaN / Infinity are not JSON
case("json-5000-digit-integer", "[" + "1" * 5000 + "]", [A(type="is-json")])
case("json-long-integer-schema", '{"n": ' + "9" * 400 + "}", [A(type="is-json", value={"properties": {"n": {"type": "number"}}})])
case("json-infinity", "Infinity", [A(type="is-json")])
case("json-minus-infinity-in-array", "[-Infinity]", [A(type="is-json")])
case("json-bom", "\ufeff{}", [A(type="is-json")])
case("json-lone-surrogate-escape", '["\\ud800"]', [A(type="is-json")])
case("py-inf", "x", [A(type="python", value="float('inf')")])
case("py-nan", "x", [A(type="python", value="float('nan')")])
case("py-dict-inf-score", "x", [A(type="python", value="{'pass': True, 'score': float('inf'), 'reason': 'r'}")])

# 7. contains-json converts // comments before parsing
case("cj-line-comment", '{"a": 1, // note\n "b": 2}', [A(type="contains-json", value={"required": ["b"]})])
case("cj-comment-in-string-kept", '{"a": "x // y"}', [A(type="contains-json", value={"properties": {"a": {"const": "x // y"}}})])
case("cj-url-kept", '{"u": "http://x.io"}', [A(type="contains-json", value={"properties": {"u": {"const": "http://x.io"}}})])
case("cj-bare-url-kept", "{u: http://x.io/a}", [A(type="contains-json", value={"properties": {"u": {"const": "http://x.io/a"}}})])
case("cj-triple-slash", '{"a": 1 /// c\n}', [A(type="contains-json")])
case("cj-apostrophe-word", "{a: don't // c\n}", [A(type="contains-json", value={"properties": {"a": {"const": "don't"}}})])

# 8. the treebank tokenizer's quotes (js-rouge 3.2)
case("tb-opening-quote-at-start", '"hello world" she said', [A(type="rouge-n", value='" hello world " she said', threshold=0.99)])
case("tb-quote-start-vs-inner", '"hi" there', [A(type="rouge-n", value='there "hi"', threshold=0.99)])
case("tb-quote-after-period-closes", 'end." next', [A(type="rouge-n", value='end. " next', threshold=0.99)])
case("tb-two-quoted", 'a "b" "c"', [A(type="rouge-n", value='a " b " " c "', threshold=0.99)])
case("tb-quote-after-paren", '("x")', [A(type="rouge-n", value='( " x " )', threshold=0.99)])
case("tb-backticks", "``x'' y", [A(type="rouge-n", value='"x" y', threshold=0.99)])
case("tb-apostrophe-quote", "'tis fine", [A(type="rouge-n", value="'t is fine", threshold=0.99)])
case("tb-closing-at-end", 'he said "no"', [A(type="rouge-n", value='he said " no "', threshold=0.99)])

# 9. python: results and the context promptfoo passes
case("py-list-is-not-score", "x", [A(type="python", value="[1, 2]")])
case("py-empty-list", "x", [A(type="python", value="[]")])
case("py-tuple-is-list", "x", [A(type="python", value="(0.5,)")])
case("py-context-keys", "x", [A(type="python", value="sorted(context.keys()) == ['prompt', 'provider', 'providerResponse', 'test', 'vars']")])
case("py-context-keys-config", "x", [A(type="python", value="sorted(context.keys()) == ['config', 'prompt', 'provider', 'providerResponse', 'test', 'vars']", config={"k": 1})])
case("py-context-output", "hello", [A(type="python", value="context['providerResponse']['output'] == output and context['prompt'] == '' and context['vars'] == {}")])
case("py-context-test", "x", [A(type="python", value="context['test']['providerOutput'] == 'x' and context['test']['assert'][0]['type'] == 'python'")])
case("py-context-no-logprobs", "x", [A(type="python", value="'logProbs' not in context")])

# 10. what makes promptfoo reject the whole config is that case's ERROR, not the batch's
case("batch-ref-in-schema", '{"a": 1}', [A(type="is-json", value={"properties": {"a": {"$ref": "#/definitions/x"}}, "definitions": {"x": {"type": "string"}}})])
case("batch-nested-assert-set", "abc", [A(type="assert-set", assert_=[A(type="assert-set", assert_=[A(type="contains", value="a")])])])
case("batch-ref-in-set", "abc", [A(type="assert-set", assert_=[A(type="contains-json", value={"$ref": "#/x"})])])


def _assertions(raw: list[dict]) -> list[dict]:
    out = []
    for a in raw:
        a = dict(a)
        if "assert_" in a:
            a["assert"] = _assertions(a.pop("assert_"))
        out.append(a)
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> dict[str, tuple]:
    if find_cli() is None:
        message = "the promptfoo CLI is not installed (bash .ci/setup test installs promptfoo@0.121)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the parity suite, but {message}", pytrace=False)
        pytest.skip(message)
    file_case = tmp_path_factory.mktemp("py") / "check.py"
    file_case.write_text("def get_assert(output, context):\n    return {'pass': 'A-42' in output, 'score': 0.75, 'reason': 'file'}\n")
    cases = [
        EvalCase(attempt_id=name, final_output=output, assertions=_assertions(assertions), threshold=threshold)
        for name, output, assertions, threshold in CASES
    ]
    cases.append(EvalCase(attempt_id="python-file", final_output="about A-42",
                          assertions=[{"type": "python", "value": f"file://{file_case}"}]))
    native = asyncio.run(grade_cases(cases, backend="native"))
    cli = asyncio.run(grade_cases(cases, backend="cli"))
    return {c.attempt_id: (n, k) for c, n, k in zip(cases, native, cli, strict=True)}


def test_there_are_at_least_80_parity_cases():
    assert len(CASES) + 1 >= 80


def test_the_javascript_edges_have_at_least_60_cases():
    assert len(CASES) - CASES.index(next(c for c in CASES if c[0] == "ws-any-bom-trimmed")) >= 60


@pytest.mark.parametrize("name", [c[0] for c in CASES] + ["python-file"])
def test_native_and_cli_agree(graded, name):
    native, cli = graded[name]
    assert (native.error is None) == (cli.error is None), (native, cli)
    assert native.status == cli.status, (native.error, cli.error)
    assert native.passed == cli.passed, (native, cli)
    assert native.score == pytest.approx(cli.score, abs=1e-9), (native, cli)
    assert native.backend == "native" and cli.backend == "cli"
    # The bundles agree on what the parity suite compares, and both envelopes are valid v1.
    n_row, c_row = (o.native_bundle["results"]["results"][0] for o in (native, cli))
    assert (n_row["success"], n_row["failureReason"]) == (c_row["success"], c_row["failureReason"])
    assert n_row["score"] == pytest.approx(c_row["score"], abs=1e-9)
    n_parts, c_parts = ((row["gradingResult"] or {}).get("componentResults", []) for row in (n_row, c_row))
    assert [(c["pass"], pytest.approx(c["score"], abs=1e-9)) for c in n_parts] == [(c["pass"], c["score"]) for c in c_parts]
    for outcome in (native, cli):
        envelope = validate_framework_result(outcome.framework_result.to_json())
        assert envelope.framework.runner == outcome.backend
    if native.status == "succeeded":
        n_find, c_find = native.framework_result.findings, cli.framework_result.findings
        assert [(f.path, f.outcome) for f in n_find] == [(f.path, f.outcome) for f in c_find]
