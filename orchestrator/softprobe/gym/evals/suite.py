"""Eval suites: a YAML file of tasks, each run in its own episode and graded afterwards.

```yaml
name: support desk
image: softprobe/support-desk:latest
seed: ./seed                      # optional folder, relative to this file
concurrency: 2
limits: {max_steps: 20, tool_timeout_s: 30, container: {memory: 512m}}
split: {train_ratio: 0.75, seed: 7, run: eval}     # optional
bundle: ./worlds/desk              # optional environment bundle folder for every task
tape_mode: replay                  # optional: off | record | replay (default: replay with a tape, else off)
tape: ./tapes                      # optional: a folder of tapes, one per task: ./tapes/<task id>/
record_processes: true             # optional: tape each shell.exec as one CHILD_PROCESS (with a tape)
time_policy: recorded              # optional: live | recorded (the clock starts at the tape's instant)
random_seed: 7                     # optional: PYTHONHASHSEED / SOFTPROBE_RANDOM_SEED of every process
tasks:
  - id: refund-a42
    bundle: ./worlds/billing       # optional: this task's bundle (overrides the suite's)
    tape: ./tapes/refund-a42-v2    # optional: exactly this task's tape folder (tape_mode: too)
    files: {"README.md": "refunds go in refund-note.md"}   # optional seed files of its own
    actions:                      # or: policy: my_policies:refund (module:function), or a model:
                                  #   policy: {kind: chat-completions, base_url, model, prompt, ...}
      - {type: tool, name: crm.get_account, args: {id: A-42}}
      - {type: terminate, output: "Refund noted for A-42"}
    checks:                       # per-step reward facts
      - {name: note_written, file_exists: refund-note.md}
      - {name: saw_account, observation_contains: Acme}
    assert: [{type: contains, value: A-42}]   # promptfoo assertions on the finished rollout
    threshold: 0.5
```

A task with a bundle runs on a host made from it: the bundle's image, seed, tools, services,
network, limits, capabilities and episode policy replace the suite's ``image``, ``seed`` and
``limits`` (a task's own ``seed``/``files`` still replace the bundle's seed; the suite's
``limits.max_steps`` still holds when the bundle's episode policy sets none), and the bundle's
assertions, as resolved when the run started, are added to the task's. A ``limits`` entry that
no task uses (every task's bundle replaces it) is refused by the preflight, at its line.

Dependency tapes (:meth:`Suite.tape_of`): a task's ``tape_mode``/``tape`` win over the suite's, and
so do its ``record_processes``/``time_policy``/``random_seed`` (:meth:`Suite.episode_options`).
A task's ``tape`` is exactly its tape folder; the suite's is a folder holding one per task,
``<tape>/<task id>/``. ``record`` without a tape records into the task's episode folder
(``<episode dir>/tape/``). A task to replay whose tape has no ``tape.jsonl`` is refused by the
preflight, at its line, before anything runs.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from softprobe.gym.actions import Action
from softprobe.gym.episodes.store import EPISODE_ID_PATTERN
from softprobe.gym.errors import ConfigurationError
from softprobe.gym.policies.spec import ChatPolicySpec
from softprobe.gym.settings import ContainerSettings
from softprobe.gym.yamllines import YamlFileError, parse_yaml

_REPEATED = "task ids must be unique"
# A task's ``policy`` is ``module:function`` or a mapping (a model policy); the tag pydantic puts
# in an error's location is taken out again, so problems name the file's own keys.
_POLICY_MAPPING = "mapping"
PolicyField = Annotated[
    Annotated[str, Tag("ref")] | Annotated[ChatPolicySpec, Tag(_POLICY_MAPPING)],
    Discriminator(lambda v: "ref" if isinstance(v, str) else _POLICY_MAPPING),
]


class SuiteError(ConfigurationError):
    """The suite file is not valid; the message points at the lines."""


class Check(BaseModel):
    """A per-step reward fact: exactly one of the conditions."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    file_exists: str | None = None
    file_contains: dict[str, str] | None = None  # {path, text}
    observation_contains: str | None = None
    no_error: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Check:
        given = [
            k
            for k in ("file_exists", "file_contains", "observation_contains", "no_error")
            if getattr(self, k) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "a check needs exactly one of file_exists, file_contains, observation_contains, no_error"
                f" (got {', '.join(given) or 'none'})"
            )
        if self.file_contains is not None and set(self.file_contains) != {"path", "text"}:
            raise ValueError("file_contains needs {path: ..., text: ...}")
        return self


class Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=50, ge=1)
    tool_timeout_s: float = Field(default=30.0, gt=0)
    container: ContainerSettings = Field(default_factory=ContainerSettings)


class Split(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train_ratio: float = Field(gt=0, lt=1)
    seed: int | str = 7
    run: Literal["train", "eval"] = "eval"


TapeModeName = Literal["off", "record", "replay"]


class EpisodeOptions(BaseModel):
    """What a suite or a task may set of its episodes' tapes, clock and seed (None: the host's)."""

    record_processes: StrictBool | None = None
    time_policy: Literal["live", "recorded"] | None = None
    random_seed: StrictInt | None = Field(default=None, ge=0, lt=2**32)


class Task(EpisodeOptions):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str
    bundle: Path | None = None
    tape_mode: TapeModeName | None = None
    tape: Path | None = None
    seed: Path | None = None
    files: dict[str, str] | None = None
    actions: list[Action] | None = None
    policy: PolicyField | None = None
    checks: list[Check] = Field(default_factory=list)
    assertions: list[dict[str, Any]] = Field(default_factory=list, alias="assert")
    threshold: float | None = None

    @field_validator("id")
    @classmethod
    def _id_is_an_episode_id(cls, value: str) -> str:
        if not EPISODE_ID_PATTERN.match(value):
            raise ValueError("task ids use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @model_validator(mode="after")
    def _actions_or_policy(self) -> Task:
        if (self.actions is None) == (self.policy is None):
            raise ValueError("a task needs either actions (a list) or policy (module:function or a mapping), not both")
        if isinstance(self.policy, str) and ":" not in self.policy:
            raise ValueError("policy must be 'module:function'")
        if self.seed is not None and self.files is not None:
            raise ValueError("a task takes seed (a folder) or files (inline), not both")
        names = [c.name for c in self.checks]
        if len(set(names)) != len(names):
            raise ValueError("check names must be unique within a task")
        for assertion in self.assertions:
            if not isinstance(assertion, dict) or "type" not in assertion:
                raise ValueError("each assert entry needs a type")
        return self


class Suite(EpisodeOptions):
    model_config = ConfigDict(extra="forbid")

    name: str = "suite"
    image: str = "softprobe/support-desk:latest"
    seed: Path | None = None
    bundle: Path | None = None
    tape_mode: TapeModeName | None = None
    tape: Path | None = None
    concurrency: int = Field(default=2, ge=1, le=256)
    backend: Literal["native", "cli", "auto"] = "auto"
    limits: Limits = Field(default_factory=Limits)
    split: Split | None = None
    tasks: list[Task] = Field(min_length=1)
    base_dir: Path = Field(default=Path("."), exclude=True)
    _source: Path | None = PrivateAttr(default=None)  # the file it was loaded from
    _lines: dict[tuple[Any, ...], int] = PrivateAttr(default_factory=dict)  # field -> line in it

    @model_validator(mode="after")
    def _unique_ids(self) -> Suite:
        ids = [t.id for t in self.tasks]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"{_REPEATED}; repeated: {', '.join(repeated)}")
        return self

    def where(self, *loc: str | int) -> str:
        """``FILE:LINE`` of a field of the suite file, e.g. ``where("tasks", 2, "seed")``; the
        nearest enclosing field's line when the file does not spell that one out."""
        return _where(self._source or Path("<suite>"), self._lines, tuple(loc))

    def resolve(self, path: Path | None) -> Path | None:
        return None if path is None else (self.base_dir / path).resolve()

    def bundle_of(self, task: Task) -> Path | None:
        """The bundle folder ``task`` runs on (its own, else the suite's), absolute; or None."""
        return self.resolve(task.bundle if task.bundle is not None else self.bundle)

    def bundle_loc(self, task: Task) -> tuple[str | int, ...]:
        """Where the suite file names ``task``'s bundle (for problems)."""
        return ("tasks", self.tasks.index(task), "bundle") if task.bundle is not None else ("bundle",)

    def tape_of(self, task: Task) -> tuple[TapeModeName, Path | None]:
        """``(tape mode, tape folder)`` of ``task`` as the suite file sets it: its own
        ``tape_mode``, else the suite's, else ``replay`` when a tape is named and ``off`` when
        none is; its own ``tape`` (exactly its folder), else ``<suite tape>/<task id>``, else
        None (``record`` then writes into the task's episode folder). ``off`` has no folder."""
        folder = self.resolve(task.tape)
        if folder is None and self.tape is not None:
            folder = (self.base_dir / self.tape / task.id).resolve()
        mode: TapeModeName = task.tape_mode or self.tape_mode or ("replay" if folder is not None else "off")
        return mode, folder if mode != "off" else None

    def episode_options(self, task: Task) -> dict[str, Any]:
        """``record_processes``, ``time_policy`` and ``random_seed`` of ``task``'s episode: its
        own, else the suite's; those neither sets are left out (the host's apply)."""
        options = {}
        for name in EpisodeOptions.model_fields:
            value = getattr(task, name)
            value = getattr(self, name) if value is None else value
            if value is not None:
                options[name] = value
        return options

    def tape_loc(self, task: Task) -> tuple[str | int, ...]:
        """Where the suite file names ``task``'s tape (for problems)."""
        index = self.tasks.index(task)
        if task.tape is not None:
            return ("tasks", index, "tape")
        if task.tape_mode is not None:
            return ("tasks", index, "tape_mode")
        return ("tape",) if self.tape is not None else ("tape_mode",)

    def policy(self, task: Task) -> Callable[..., Any]:
        """Import ``module:function`` (the suite's folder is searched first), or make the model
        policy a mapping declares (a new one per call)."""
        assert task.policy is not None
        if isinstance(task.policy, ChatPolicySpec):
            try:
                return task.policy.build()
            except ConfigurationError as err:
                raise SuiteError(f"task {task.id}: {err}") from None
        module_name, _, function = task.policy.partition(":")
        folder = str(self.base_dir.resolve())
        if folder not in sys.path:
            sys.path.insert(0, folder)
        try:
            policy: Callable[..., Any] = getattr(importlib.import_module(module_name), function)
            return policy
        except (ImportError, AttributeError) as err:
            raise SuiteError(f"task {task.id}: cannot load policy {task.policy!r}: {err}") from None


def load_suite(path: str | Path) -> Suite:
    """Read and validate a suite file.

    Raises:
        SuiteError: the file is missing, not YAML, or not a valid suite; each problem is reported
            as ``FILE:LINE: where: what``.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise SuiteError(f"cannot read {path}: {err.strerror}") from None
    try:
        doc = parse_yaml(text, shown=str(path))
    except YamlFileError as err:
        # Suite problems name FILE:LINE (no column), like every other line of the report.
        where = f"{path}:{err.line}" if err.line is not None else str(path)
        raise SuiteError(f"{where}: {err.problem}") from None
    data = doc.data
    if not isinstance(data, dict):
        raise SuiteError(f"{path}:1: a suite is a mapping with at least 'tasks'")
    lines = {loc: line for loc, (line, _column) in doc.marks.items()}
    problems = _repeated_ids(path, data, lines)
    try:
        suite = Suite.model_validate({**data, "base_dir": path.parent.resolve()})
    except ValidationError as err:
        for error in err.errors():
            loc = _untagged(tuple(error["loc"]))
            if not loc and _REPEATED in error["msg"] and problems:
                continue  # already reported at the repeated id's own line
            problems.append(f"{_where(path, lines, loc)}: {'.'.join(str(p) for p in loc) or 'suite'}: {error['msg']}")
    if problems:
        raise SuiteError("invalid suite:\n" + "\n".join(problems)) from None
    suite._source = path
    suite._lines = lines
    return suite


def _untagged(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """An error's location without the tag pydantic adds after ``policy`` for a mapping."""
    return tuple(p for i, p in enumerate(loc) if not (p == _POLICY_MAPPING and i and loc[i - 1] == "policy"))


def _where(path: Path, lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> str:
    """``FILE:LINE`` of ``loc`` (or of the nearest enclosing field the file has)."""
    line = next((lines[loc[:n]] for n in range(len(loc), -1, -1) if loc[:n] in lines), 1)
    return f"{path}:{line}"


def _repeated_ids(path: Path, data: dict[str, Any], lines: dict[tuple[Any, ...], int]) -> list[str]:
    """One problem per task whose id an earlier task already has, at the repeated id's line."""
    tasks = data.get("tasks")
    if not isinstance(tasks, list):
        return []
    first: dict[str, int] = {}  # id -> index of the first task with it
    problems = []
    for index, task in enumerate(tasks):
        task_id = task.get("id") if isinstance(task, dict) else None
        if not isinstance(task_id, str):
            continue
        if task_id in first:
            earlier = first[task_id]
            problems.append(
                f"{_where(path, lines, ('tasks', index, 'id'))}: tasks.{index}.id: {_REPEATED}: "
                f"{task_id!r} is already the id of tasks.{earlier} (line "
                f"{lines.get(('tasks', earlier, 'id'), 1)}); rename one of them"
            )
        else:
            first[task_id] = index
    return problems
