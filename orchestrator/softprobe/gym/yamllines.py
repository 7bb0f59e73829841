"""YAML files read with where each field was written, so problems point at ``FILE:LINE:COL``.

Used by eval suites (``evals/suite.py``) and environment bundles (``bundles/``): both validate a
YAML file with pydantic and report each problem at the line of the field it concerns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

#: A field's path in a document: keys and list indexes, as in pydantic's ``loc``.
Loc = tuple[Any, ...]
#: ``describe(loc, error)``: a better message for a pydantic error, or None for its own.
Describe = Callable[[Loc, dict[str, Any]], "str | None"]


@dataclass(frozen=True)
class LocatedYaml:
    """A parsed YAML document and where (1-based line, column) each field of it starts.

    Attributes:
        shown: the file's name as problems name it.
        data: the document (plain Python values, as ``yaml.safe_load`` gives).
        marks: ``loc`` -> (line, column) of the key (for a mapping entry) or the item.
    """

    shown: str
    data: Any
    marks: dict[Loc, tuple[int, int]] = field(default_factory=dict)

    def mark(self, loc: Loc) -> tuple[int, int]:
        """(line, column) of ``loc``, or of the nearest enclosing field the file spells out."""
        return next((self.marks[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in self.marks), (1, 1))

    def where(self, loc: Loc) -> str:
        """``FILE:LINE:COL`` of ``loc`` (see :meth:`mark`)."""
        line, column = self.mark(loc)
        return f"{self.shown}:{line}:{column}"

    def problem(self, loc: Loc, message: str) -> str:
        """One problem line: ``FILE:LINE:COL: dotted.loc: message``."""
        return f"{self.where(loc)}: {dotted(loc) or '(top level)'}: {message}"

    def validation_problems(
        self, err: ValidationError, prefix: Loc = (), describe: Describe | None = None
    ) -> list[str]:
        """One :meth:`problem` per error of ``err`` (raised validating the value at ``prefix``).

        Args:
            describe: ``describe(loc, error)`` may return a better message for an error
                (None: the default one).
        """
        problems = []
        for error in err.errors():
            loc = self.file_loc(prefix + tuple(error["loc"]))
            message = describe(loc, dict(error)) if describe is not None else None
            if message is None and error["type"] == "extra_forbidden":
                message = f"unknown key {loc[-1]!r}"
            problems.append(self.problem(loc, message or error_message(error["msg"])))
        return problems

    def file_loc(self, loc: Loc) -> Loc:
        """``loc`` without the parts pydantic adds that the file has no key for: a union
        member's tag (``demo.0.tool.args`` -> ``demo.0.args``). A name that is the last part
        stays (a missing required field)."""
        kept: list[Any] = []
        for index, part in enumerate(loc):
            value = self.value_at(tuple(kept))
            is_tag = isinstance(value, dict) and part not in value and index < len(loc) - 1
            if not is_tag:
                kept.append(part)
        return tuple(kept)

    def value_at(self, loc: Loc) -> Any:
        """The document's value at ``loc`` (None where there is none)."""
        value = self.data
        for part in loc:
            try:
                value = value[part]
            except (KeyError, IndexError, TypeError):
                return None
        return value


def error_message(msg: str) -> str:
    """A pydantic error message without the ``Value error, `` prefix a validator's
    ``ValueError`` gets."""
    return msg.removeprefix("Value error, ")


def dotted(loc: Loc) -> str:
    """``("services", 0, "name")`` -> ``"services.0.name"``."""
    return ".".join(str(part) for part in loc)


def read_yaml(path: Path, *, shown: str | None = None) -> LocatedYaml:
    """Parse ``path`` (YAML, safe loader) and record where each field starts.

    Raises:
        YamlFileError: the file cannot be read, or is not valid YAML (``FILE:LINE:COL: ...``).
    """
    name = shown or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise YamlFileError(name, None, None, f"cannot read: {reason}") from None
    return parse_yaml(text, shown=name)


#: The largest YAML file read: suites and bundles are hand-written; a bigger one is a mistake.
MAX_YAML_BYTES = 4 * 1024 * 1024


def parse_yaml(text: str, *, shown: str) -> LocatedYaml:
    """Like :func:`read_yaml`, for text already read.

    Aliases (``*name``) are refused: each one repeats a whole subtree, so a few hundred bytes
    of nested aliases expand to billions of nodes (a "billion laughs" file).
    """
    if len(text) > MAX_YAML_BYTES:
        raise YamlFileError(shown, None, None, f"larger than {MAX_YAML_BYTES // 1024 // 1024} MiB")
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                mark = event.start_mark
                line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
                raise YamlFileError(shown, line, column,
                                    f"YAML aliases (*{event.anchor}) are not supported; write the value out")
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err)
        line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
        raise YamlFileError(shown, line, column, f"not valid YAML: {problem}") from None
    marks: dict[Loc, tuple[int, int]] = {}
    record_marks(root, (), marks)
    return LocatedYaml(shown=shown, data=data, marks=marks)


class YamlFileError(ValueError):
    """A YAML file cannot be read or parsed; the message is ``FILE:LINE:COL: problem``.

    Attributes:
        shown: the file's name; ``line`` and ``column`` (1-based; None when unknown);
        problem: what is wrong.
    """

    def __init__(self, shown: str, line: int | None, column: int | None, problem: str) -> None:
        where = shown if line is None else f"{shown}:{line}:{column}"
        super().__init__(f"{where}: {problem}")
        self.shown, self.line, self.column, self.problem = shown, line, column, problem


def record_marks(node: Any, path: Loc, marks: dict[Loc, tuple[int, int]]) -> None:
    """Fill ``marks`` with the (line, column) of every field under ``node`` (a composed YAML
    node); a mapping entry is placed at its key, not its value."""
    if node is None:
        return
    marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, key.value)
            record_marks(value, child, marks)
            marks[child] = (key.start_mark.line + 1, key.start_mark.column + 1)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            record_marks(item, (*path, index), marks)


__all__ = ["Loc", "LocatedYaml", "YamlFileError", "dotted", "parse_yaml", "read_yaml", "record_marks"]
