"""Reading an experiment file: every error names the exact field path, as the dock's
config does (``models[1].price.input must be a number >= 0``).

The smallest file::

    tasks: [{id: greet, input: hello, target: pong}]
    scorer: includes
    models: [{provider: ping, model: ping-1}]
    loops: [standard, minimal-first]
    repeats: 2

``providers:`` defines providers as the dock config's section does (an OpenAI-compatible
server by name, its key's variable by name), registered for the run.

Paths inside the file (datasets, sample files) are relative to the file's directory.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import attrs

from loopdock.actors.dock import ID_PATTERN as LOOP_ID
from loopdock.actors.dock import DockError, parse_providers
from loopdock.runtime import YamlFileError, cut, load_yaml_file
from loopdock.runtime import short_repr as _quote
from loopdock.runtime.models import ProviderSpec

from ._errors import ExperimentError
from ._spec import (
    Concurrency,
    Experiment,
    FileSource,
    Judge,
    Limits,
    Loop,
    Model,
    Price,
    Sample,
    Scorer,
    Task,
)

T = TypeVar("T")

# No dots: a rollout's session id is exp.<run>.<key>.<attempt>.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_FUNCTION = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
_SIMPLE_SCORERS = ("exact", "includes", "regex")


#: The longest error message: values are quoted cut short (``_quote``), and the whole is
#: cut again, so a file with huge values gets a readable error (as the dock config does).
MAX_MESSAGE = 1_000


def _error(message: str) -> ExperimentError:
    return ExperimentError("INVALID_EXPERIMENT", cut(message, MAX_MESSAGE))


def _mapping(value: object, path: str, known: tuple[str, ...], required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _error(f"{path or 'the experiment'} must be a mapping, got {_quote(value)}")
    for key in value:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            raise _error(f"unknown key {where}; known keys: {', '.join(known)}")
    for key in required:
        if key not in value:
            raise _error(f"{path + '.' if path else ''}{key} is required")
    return dict(value)


def _list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise _error(f"{path} must be a non-empty list, got {_quote(value)}")
    return value


def _text(value: object, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _error(f"{path} must be a non-empty string, got {_quote(value)}")
    return value


def _positive_int(value: object, path: str) -> int:
    # bool is an int subclass; `repeats: true` is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _error(f"{path} must be a positive integer, got {_quote(value)}")
    return value


def _number(value: object, path: str, *, positive: bool) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 or (positive and value == 0):
        raise _error(f"{path} must be a number {'> 0' if positive else '>= 0'}, got {_quote(value)}")
    return float(value)


def _optional(fields: Mapping[str, Any], key: str, path: str, check: Callable[[object, str], T]) -> T | None:
    return check(fields[key], f"{path}.{key}" if path else key) if key in fields else None


def _id(value: object, path: str) -> str:
    # JSON datasets often number their samples.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _text(value, path)


# -- samples and tasks -------------------------------------------------------------------


def _targets(value: object, path: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise _error(f"{path} must be a string or a non-empty list of strings, got {_quote(value)}")


def _files(value: object, path: str, base: Path) -> dict[str, FileSource]:
    if not isinstance(value, Mapping):
        raise _error(f"{path} must be a mapping of destination path to source, got {_quote(value)}")
    files = {}
    for dest, source in value.items():
        where = f"{path}.{dest}"
        relative = PurePosixPath(dest) if isinstance(dest, str) else None
        # The working directory is the agent's whole world: nothing may land outside it.
        if relative is None or not dest or relative.is_absolute() or ".." in relative.parts:
            raise _error(f"{path} key {_quote(dest)} must be a relative path inside the working directory")
        if isinstance(source, str):
            source_path = (base / source).resolve()
            if not source_path.exists():
                raise _error(f"{where}: {source_path} does not exist")
            files[dest] = FileSource(path=source_path)
        elif isinstance(source, Mapping):
            fields = _mapping(source, where, ("text",), ("text",))
            if not isinstance(fields["text"], str):
                raise _error(f"{where}.text must be a string, got {_quote(fields['text'])}")
            files[dest] = FileSource(text=fields["text"])
        else:
            raise _error(f"{where} must be a source path or {{text: ...}}, got {_quote(source)}")
    return files


_SAMPLE_KEYS = ("id", "input", "target", "files", "metadata")


def _sample(value: object, path: str, base: Path, default_id: str) -> Sample:
    fields = _mapping(value, path, _SAMPLE_KEYS, ("input",))
    metadata = fields.get("metadata", {})
    if not isinstance(metadata, Mapping):
        raise _error(f"{path}.metadata must be a mapping, got {_quote(metadata)}")
    return Sample(
        id=_id(fields["id"], f"{path}.id") if "id" in fields else default_id,
        input=_text(fields["input"], f"{path}.input"),
        target=_targets(fields["target"], f"{path}.target") if "target" in fields else (),
        files=_files(fields["files"], f"{path}.files", base) if "files" in fields else {},
        metadata=dict(metadata),
    )


def _read_text(file: Path, path: str) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise _error(f"{path}: cannot read {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _error(f"{path}: {file} is not UTF-8 text") from None


def _csv_dataset(value: object, path: str, base: Path) -> tuple[Sample, ...]:
    """A header row naming ``input`` (required), ``target`` and ``id`` (optional); any other
    column goes into each sample's metadata."""
    file = (base / _text(value, path)).resolve()
    rows = list(csv.reader(io.StringIO(_read_text(file, path), newline="")))
    if not rows or "input" not in rows[0]:
        raise _error(f"{path}: {file.name} needs a header row with an input column, got {_quote(rows[0] if rows else [])}")
    header = rows[0]
    samples: list[Sample] = []
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        where = f"{path} ({file.name} row {number})"
        if len(row) != len(header):
            raise _error(f"{where}: {len(row)} fields, the header has {len(header)}")
        record = dict(zip(header, row, strict=True))
        if not record["input"].strip():
            raise _error(f"{where}: input is empty")
        target = record.pop("target", "")
        sample_id = record.pop("id", "") or str(len(samples) + 1)
        text = record.pop("input")
        samples.append(Sample(id=sample_id, input=text, target=(target,) if target else (), metadata=record))
    if not samples:
        raise _error(f"{path}: {file} holds no samples")
    return tuple(samples)


#: Inspect's sample fields this loader reads; the sandbox ones have no meaning here.
_INSPECT_KEYS = ("id", "input", "target", "choices", "metadata")
_INSPECT_UNSUPPORTED = ("sandbox", "files", "setup")


def _message_text(message: object, where: str) -> tuple[str, str]:
    """(role, text) of one of Inspect's chat messages: content a string or text parts."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise _error(f"{where} must be a chat message with a role, got {_quote(message)}")
    content = message.get("content")
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, Mapping) and part.get("type") == "text"]
        texts = [part for part in parts if isinstance(part, str)]
        if len(texts) != len(content):
            raise _error(f"{where}.content: only text parts can be sent to an agent, got {_quote(content)}")
        content = "\n".join(texts)
    if not isinstance(content, str):
        raise _error(f"{where}.content must be text, got {_quote(content)}")
    return message["role"], content


def _inspect_input(value: object, where: str) -> str:
    """A string, or a list of system and user messages: the agent gets one message, the
    system texts first, then the user texts, separated by blank lines."""
    if isinstance(value, str):
        return _text(value, where)
    if not isinstance(value, list) or not value:
        raise _error(f"{where} must be a string or a non-empty list of chat messages, got {_quote(value)}")
    texts: dict[str, list[str]] = {"system": [], "user": []}
    for index, message in enumerate(value):
        role, text = _message_text(message, f"{where}[{index}]")
        if role not in texts:
            raise _error(f"{where}[{index}]: a {role!r} message cannot be replayed as an agent's input; "
                         "only system and user messages can")  # fmt: skip
        texts[role].append(text)
    if not texts["user"]:
        raise _error(f"{where} holds no user message")
    return "\n\n".join([*texts["system"], *texts["user"]])


def _inspect_sample(record: object, where: str, default_id: str) -> Sample:
    if isinstance(record, Mapping):
        for key in _INSPECT_UNSUPPORTED:
            if key in record:
                raise _error(f"{where}: Inspect's {key!r} is not supported (an agent works in its own folder)")
    fields = _mapping(record, where, _INSPECT_KEYS, ("input",))
    text = _inspect_input(fields["input"], f"{where}.input")
    if "choices" in fields:
        choices = fields["choices"]
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices) or len(choices) > 26:
            raise _error(f"{where}.choices must be a list of 1 to 26 strings, got {_quote(choices)}")
        text += "\n\n" + "\n".join(f"{chr(ord('A') + i)}) {choice}" for i, choice in enumerate(choices))
    metadata = fields.get("metadata", {})
    if not isinstance(metadata, Mapping):
        raise _error(f"{where}.metadata must be a mapping, got {_quote(metadata)}")
    return Sample(
        id=_id(fields["id"], f"{where}.id") if "id" in fields else default_id,
        input=text,
        target=_targets(fields["target"], f"{where}.target") if "target" in fields else (),
        metadata=dict(metadata),
    )


def _jsonl_records(value: object, path: str, base: Path) -> tuple[Path, list[tuple[str, object]]]:
    """The file and its records, each with where it is (for errors)."""
    file = (base / _text(value, path)).resolve()
    records = []
    for number, line in enumerate(_read_text(file, path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} ({file.name} line {number})"
        try:
            records.append((where, json.loads(line)))
        except ValueError as exc:
            raise _error(f"{where}: not JSON: {exc}") from None
    if not records:
        raise _error(f"{path}: {file} holds no samples")
    return file, records


def _dataset(value: object, path: str, base: Path) -> tuple[Sample, ...]:
    if isinstance(value, Mapping):
        if list(value) == ["csv"]:
            return _csv_dataset(value["csv"], f"{path}.csv", base)
        if list(value) == ["inspect"]:
            _, records = _jsonl_records(value["inspect"], f"{path}.inspect", base)
            return tuple(_inspect_sample(record, where, str(i + 1)) for i, (where, record) in enumerate(records))
        raise _error(f"{path} must be a JSONL file, {{csv: FILE}} or {{inspect: FILE}}, got {_quote(value)}")
    file, records = _jsonl_records(value, path, base)
    return tuple(_sample(record, where, file.parent, str(i + 1)) for i, (where, record) in enumerate(records))


_TASK_KEYS = ("id", "input", "target", "samples", "dataset", "files", "scorer", "metadata")


def _task(value: object, path: str, base: Path) -> Task:
    fields = _mapping(value, path, _TASK_KEYS, ("id",))
    sources = [key for key in ("input", "samples", "dataset") if key in fields]
    if len(sources) != 1:
        raise _error(f"{path} needs exactly one of input (one sample), samples or dataset; got {sources or 'none'}")
    if "target" in fields and "input" not in fields:
        raise _error(f"{path}.target goes with input (one sample); samples and datasets give their own")
    if sources == ["input"]:
        inline = {k: fields[k] for k in ("input", "target", "metadata") if k in fields}
        samples: tuple[Sample, ...] = (_sample(inline, path, base, "1"),)
    elif sources == ["samples"]:
        items = _list(fields["samples"], f"{path}.samples")
        samples = tuple(_sample(s, f"{path}.samples[{i}]", base, str(i + 1)) for i, s in enumerate(items))
    else:
        samples = _dataset(fields["dataset"], f"{path}.dataset", base)
    seen: dict[str, int] = {}
    for index, sample in enumerate(samples):
        if sample.id in seen:
            raise _error(f"{path}: sample id {_quote(sample.id)} is used twice (samples {seen[sample.id] + 1} and {index + 1})")
        seen[sample.id] = index
    if "files" in fields:
        shared = _files(fields["files"], f"{path}.files", base)
        samples = tuple(Sample(s.id, s.input, s.target, {**shared, **s.files}, s.metadata) for s in samples)
    scorer = _scorer(fields["scorer"], f"{path}.scorer") if "scorer" in fields else None
    return Task(_id(fields["id"], f"{path}.id"), samples, scorer)


# -- scorers, models, loops --------------------------------------------------------------


def _function_ref(value: object, path: str) -> str:
    if not isinstance(value, str) or not _FUNCTION.fullmatch(value):
        raise _error(f"{path} must be a reference 'module:function', got {_quote(value)}")
    return value


def _judge(fields: Mapping[str, Any], path: str) -> Judge:
    prompt = _optional(fields, "prompt", path, _text)
    if prompt is not None:
        if "{answer}" not in prompt:
            raise _error(f"{path}.prompt must contain {{answer}} (and may contain {{input}} and {{target}})")
        try:
            prompt.format(input="", target="", answer="")
        except (KeyError, IndexError, ValueError) as exc:
            raise _error(
                f"{path}.prompt: only {{input}}, {{target}} and {{answer}} may stand in braces (write {{{{ and }}}} "
                f"for a brace itself): {type(exc).__name__} {exc}"
            ) from None
    return Judge(
        provider=_text(fields["provider"], f"{path}.provider"),
        model=_text(fields["model"], f"{path}.model"),
        max_tokens=_optional(fields, "max_tokens", path, _positive_int) or 1024,
        prompt=prompt,
    )


def _scorer(value: object, path: str) -> Scorer:
    if isinstance(value, str):
        if value not in _SIMPLE_SCORERS:
            raise _error(
                f"{path} must be one of {', '.join(_SIMPLE_SCORERS)} or a mapping with a kind "
                f"(python, judge, ...), got {_quote(value)}"
            )
        return Scorer(kind=value)  # type: ignore[arg-type]  # checked just above
    kinds = {
        "exact": ("kind", "ignore_case"),
        "includes": ("kind", "ignore_case"),
        "regex": ("kind", "pattern", "ignore_case"),
        "python": ("kind", "function"),
        "judge": ("kind", "provider", "model", "max_tokens", "prompt"),
    }
    if not isinstance(value, Mapping) or value.get("kind") not in kinds:
        raise _error(f"{path} must be a scorer name or a mapping whose kind is one of {', '.join(kinds)}, got {_quote(value)}")
    kind = value["kind"]
    required = {"python": ("function",), "judge": ("provider", "model")}.get(kind, ())
    fields = _mapping(value, path, kinds[kind], required)
    ignore_case = fields.get("ignore_case", True)
    if not isinstance(ignore_case, bool):
        raise _error(f"{path}.ignore_case must be true or false, got {_quote(ignore_case)}")
    pattern = _optional(fields, "pattern", path, _text)
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _error(f"{path}.pattern is not a valid regular expression: {exc}") from None
    return Scorer(
        kind=kind,
        ignore_case=ignore_case,
        pattern=pattern,
        function=_function_ref(fields["function"], f"{path}.function") if kind == "python" else None,
        judge=_judge(fields, path) if kind == "judge" else None,
    )


def _price(value: object, path: str) -> Price:
    fields = _mapping(value, path, ("input", "output"), ("input", "output"))
    return Price(_number(fields["input"], f"{path}.input", positive=False),
                 _number(fields["output"], f"{path}.output", positive=False))  # fmt: skip


_PARAMS = ("max_tokens", "reasoning_effort", "system_prompt")


def _model(value: object, path: str, prices: Mapping[str, Price]) -> Model:
    if isinstance(value, str):
        provider, slash, name = value.partition("/")
        if not slash or not provider or not name:
            raise _error(f"{path} must be 'provider/model' or a mapping {{provider, model, ...}}, got {_quote(value)}")
        value = {"provider": provider, "model": name}
    fields = _mapping(value, path, ("provider", "model", "params", "price", "adapter"), ("provider", "model"))
    params = _mapping(fields.get("params", {}), f"{path}.params", _PARAMS)
    model = Model(
        provider=_text(fields["provider"], f"{path}.provider"),
        model=_text(fields["model"], f"{path}.model"),
        max_tokens=_optional(params, "max_tokens", f"{path}.params", _positive_int),
        reasoning_effort=_optional(params, "reasoning_effort", f"{path}.params", _text),
        system_prompt=_optional(params, "system_prompt", f"{path}.params", _text),
        price=_optional(fields, "price", path, _price),
        adapter=_optional(fields, "adapter", path, _function_ref),
    )
    if model.price is None and model.label in prices:
        model = attrs.evolve(model, price=prices[model.label])
    return model


def _loop(value: object, path: str) -> Loop:
    if isinstance(value, str):
        value = {"loop": value}
    fields = _mapping(value, path, ("loop", "driver"), ("loop",))
    loop = fields["loop"]
    if not isinstance(loop, str) or not LOOP_ID.fullmatch(loop):
        raise _error(f"{path} must be a loop id (matching {LOOP_ID.pattern}), got {_quote(loop)}")
    driver = fields.get("driver")
    if driver is not None and (not isinstance(driver, str) or not LOOP_ID.fullmatch(driver)):
        raise _error(f"{path}.driver must be a driver name (matching {LOOP_ID.pattern}), got {_quote(driver)}")
    return Loop(loop, driver)


# -- the rest ----------------------------------------------------------------------------


def _limits(value: object, path: str) -> Limits:
    fields = _mapping(value, path, ("turns", "tokens", "time", "budget"))
    return Limits(
        turns=_optional(fields, "turns", path, _positive_int),
        tokens=_optional(fields, "tokens", path, _positive_int),
        time=_optional(fields, "time", path, lambda v, p: _number(v, p, positive=True)),
        budget=_optional(fields, "budget", path, lambda v, p: _number(v, p, positive=True)),
    )


def _concurrency(value: object, path: str) -> Concurrency:
    if isinstance(value, int) and not isinstance(value, bool):
        return Concurrency(default=_positive_int(value, path))
    if not isinstance(value, Mapping):
        raise _error(f"{path} must be a positive integer or a mapping of provider to one, got {_quote(value)}")
    limits = {str(key): _positive_int(item, f"{path}.{key}") for key, item in value.items()}
    default = limits.pop("default", Concurrency().default)
    return Concurrency(default=default, providers=limits)


def parse_prices(value: object, path: str) -> dict[str, Price]:
    if not isinstance(value, Mapping):
        raise _error(f"{path} must be a mapping of 'provider/model' to {{input, output}}, got {_quote(value)}")
    return {str(label): _price(item, f"{path}.{label}") for label, item in value.items()}


def _compare(value: object, path: str, models: tuple[Model, ...], loops: tuple[Loop, ...]) -> tuple[tuple[str, str], ...]:
    labels = {m.label for m in models}
    loop_labels = {lp.label for lp in loops}
    pairs = []
    for index, pair in enumerate(_list(value, path)):
        where = f"{path}[{index}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise _error(f"{where} must be a pair [{{model, loop}}, {{model, loop}}], got {_quote(pair)}")
        cells = []
        for side, cell in enumerate(pair):
            fields = _mapping(cell, f"{where}[{side}]", ("model", "loop"), ("model", "loop"))
            if fields["model"] not in labels:
                raise _error(f"{where}[{side}].model {_quote(fields['model'])} is not one of the models: {', '.join(sorted(labels))}")
            if fields["loop"] not in loop_labels:
                raise _error(f"{where}[{side}].loop {_quote(fields['loop'])} is not one of the loops: {', '.join(sorted(loop_labels))}")
            cells.append(f"{fields['model']} x {fields['loop']}")
        pairs.append((cells[0], cells[1]))
    return tuple(pairs)


def _unique(items: tuple[T, ...], label: Callable[[T], str], path: str) -> None:
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        name = label(item)
        if name in seen:
            raise _error(f"{path}[{index}] repeats {path}[{seen[name]}] ({_quote(name)})")
        seen[name] = index


def _check_targets(experiment: Experiment) -> None:
    # A missing target with a text scorer would score every answer alike (every text
    # includes ""), so it is refused here rather than discovered in the report.
    for t_index, task in enumerate(experiment.tasks):
        scorer = experiment.scorer_for(task)
        if scorer.kind in ("exact", "includes") or (scorer.kind == "regex" and scorer.pattern is None):
            for sample in task.samples:
                if not sample.target or not all(sample.target):
                    raise _error(
                        f"tasks[{t_index}] sample {_quote(sample.id)} has no target, which the {scorer.kind} scorer needs"
                    )


_TOP_KEYS = (
    "name", "tasks", "scorer", "models", "loops", "repeats", "limits", "concurrency",
    "retries", "currency", "prices", "compare", "providers",
)  # fmt: skip


def _one_adapter_per_provider(models: tuple[Model, ...]) -> None:
    # An adapter is registered per provider: a second factory for one would be ignored.
    factories: dict[str, tuple[int, str]] = {}
    for index, model in enumerate(models):
        if model.adapter is None:
            continue
        first = factories.setdefault(model.provider, (index, model.adapter))
        if first[1] != model.adapter:
            raise _error(
                f"models[{index}].adapter {model.adapter} differs from models[{first[0]}].adapter {first[1]}, "
                f"but both are provider {model.provider!r}, which has one adapter: give each factory its own provider name"
            )


def parse_experiment(value: object, *, base: Path, default_name: str | None = None) -> Experiment:
    """Validate an experiment (as loaded from YAML) into an ``Experiment``; relative paths
    start at ``base``."""
    fields = _mapping(value, "", _TOP_KEYS, ("tasks", "scorer", "models", "loops"))
    name = fields.get("name", default_name)
    if not isinstance(name, str) or not RUN_NAME.fullmatch(name):
        raise _error(
            f"name must be a run name matching {RUN_NAME.pattern} (it defaults to the file's name), got {_quote(name)}"
        )
    tasks = tuple(_task(t, f"tasks[{i}]", base) for i, t in enumerate(_list(fields["tasks"], "tasks")))
    _unique(tasks, lambda t: t.id, "tasks")
    prices = parse_prices(fields["prices"], "prices") if "prices" in fields else {}
    models = tuple(_model(m, f"models[{i}]", prices) for i, m in enumerate(_list(fields["models"], "models")))
    _unique(models, lambda m: m.label, "models")
    _one_adapter_per_provider(models)
    loops = tuple(_loop(lp, f"loops[{i}]") for i, lp in enumerate(_list(fields["loops"], "loops")))
    _unique(loops, lambda lp: lp.label, "loops")
    retries = fields.get("retries", 2)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise _error(f"retries must be an integer >= 0, got {_quote(retries)}")
    experiment = Experiment(
        name=name,
        tasks=tasks,
        scorer=_scorer(fields["scorer"], "scorer"),
        models=models,
        loops=loops,
        repeats=_optional(fields, "repeats", "", _positive_int) or 1,
        limits=_limits(fields["limits"], "limits") if "limits" in fields else Limits(),
        concurrency=_concurrency(fields["concurrency"], "concurrency") if "concurrency" in fields else Concurrency(),
        retries=retries,
        currency=_optional(fields, "currency", "", _text) or "USD",
        compare=_compare(fields["compare"], "compare", models, loops) if "compare" in fields else (),
        providers=_experiment_providers(fields["providers"]) if "providers" in fields else {},
        base=base,
    )
    _check_targets(experiment)
    return experiment


def _experiment_providers(value: object) -> dict[str, ProviderSpec]:
    try:
        return parse_providers(value)
    except DockError as exc:
        raise _error(str(exc)) from None


def limit_samples(experiment: Experiment, limit: int) -> Experiment:
    """``experiment`` with only the first ``limit`` samples of each task (a smoke run);
    their rollouts keep their keys, so a later run without a limit goes on from them."""
    tasks = tuple(attrs.evolve(task, samples=task.samples[:limit]) for task in experiment.tasks)
    return attrs.evolve(experiment, tasks=tasks)


def load_experiment(path: str | os.PathLike[str]) -> Experiment:
    """Read an experiment file (YAML). Errors are ``INVALID_EXPERIMENT`` naming the file
    and the field path."""
    file = Path(path)
    try:
        value = load_yaml_file(file, what="experiment file")
    except YamlFileError as exc:
        raise _error(str(exc)) from None
    stem = file.stem if RUN_NAME.fullmatch(file.stem) else None
    try:
        return parse_experiment(value, base=file.resolve().parent, default_name=stem)
    except ExperimentError as exc:
        raise _error(f"{file}: {exc}") from None
