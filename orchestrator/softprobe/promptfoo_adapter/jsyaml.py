"""YAML as promptfoo loads it: js-yaml 5 with its YAML 1.2 core schema (``loadYaml``).

promptfoo reads YAML-looking text in two places that grade model output: an ``is-json`` /
``contains-json`` schema given as a string, and each ``contains-json`` candidate (loaded with
``{json: true}``, so a repeated key keeps its last value). YAML 1.2 is what makes ``yes``,
``no``, ``on`` and ``off`` strings, not booleans; ruamel.yaml (a maintained YAML 1.2 library)
reads it that way. Two js-yaml core-schema details are added on top: ``1_000`` and ``0b11`` are
strings there (ruamel reads them as integers), and JavaScript has one number type, so integers
beyond 2**53 become floats (and an integer too large for a double becomes infinity).
"""

from __future__ import annotations

import math
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.constructor import SafeConstructor
from ruamel.yaml.error import YAMLError


class JsYamlError(ValueError):
    """The text is not YAML js-yaml would load (or holds more than one document)."""


class _Constructor(SafeConstructor):
    """Core-schema integers as js-yaml reads them; repeated keys per the ``json`` option."""

    last_key_wins = False

    def construct_yaml_int(self, node: Any) -> Any:
        text = str(node.value)
        if "_" in text or text.lstrip("+-")[:2].lower() == "0b":
            return text
        return super().construct_yaml_int(node)

    def check_mapping_key(self, node: Any, key_node: Any, mapping: Any, key: Any, value: Any) -> bool:
        if key in mapping:
            if not self.last_key_wins:
                raise JsYamlError(f"duplicated mapping key {key!r}")
            mapping[key] = value
            return False
        return True


_Constructor.add_constructor("tag:yaml.org,2002:int", _Constructor.construct_yaml_int)


class _JsonConstructor(_Constructor):
    last_key_wins = True


def _loader(json_mode: bool) -> YAML:
    yaml = YAML(typ="safe", pure=True)
    yaml.Constructor = _JsonConstructor if json_mode else _Constructor
    return yaml


def _as_js(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if abs(value) < 2**53:
            return value
        try:
            return float(value)
        except OverflowError:
            return math.copysign(math.inf, value)
    if isinstance(value, dict):
        return {k: _as_js(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_js(v) for v in value]
    return value


def load_yaml(text: str, *, json_mode: bool = False) -> Any:
    """promptfoo's ``loadYaml(text)`` (``json_mode``: ``loadYaml(text, {json: true})``).

    An empty document (empty, blank or comments only) is None, as js-yaml returns undefined.

    Raises:
        JsYamlError: not YAML, a repeated key (unless ``json_mode``), or several documents.
    """
    try:
        documents = list(_loader(json_mode).load_all(text))
    except (YAMLError, JsYamlError, ValueError, TypeError) as err:
        raise JsYamlError(str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__) from None
    except RecursionError:
        raise JsYamlError("YAML nested too deeply") from None
    if len(documents) > 1:
        raise JsYamlError("expected a single document in the stream, but found more")
    return _as_js(documents[0]) if documents else None
