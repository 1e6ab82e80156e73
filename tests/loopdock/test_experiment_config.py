"""Experiment files: the smallest one as the issue writes it, the shipped one, and every
mistake named by its exact field path (as the dock's config does)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopdock.experiment import ExperimentError, load_experiment, parse_experiment
from loopdock.experiment._spec import FileSource, Limits, Loop, Price, Scorer

ROOT = Path(__file__).resolve().parents[2]
SMALLEST = {
    "tasks": [{"id": "greet", "input": "hello", "target": "pong"}],
    "scorer": "includes",
    "models": [{"provider": "ping", "model": "ping-1"}],
    "loops": ["standard", "minimal-first"],
    "repeats": 2,
}


def rejects(value: object, message: str, base: Path = ROOT) -> None:
    with pytest.raises(ExperimentError) as info:
        parse_experiment(value, base=base, default_name="x")
    assert info.value.code == "INVALID_EXPERIMENT"
    assert str(info.value) == message


def test_the_smallest_file_means_what_it_says():
    experiment = parse_experiment(SMALLEST, base=ROOT, default_name="smallest")
    assert experiment.name == "smallest"
    [task] = experiment.tasks
    [sample] = task.samples
    assert (task.id, sample.id, sample.input, sample.target) == ("greet", "1", "hello", ("pong",))
    assert experiment.scorer == Scorer("includes")
    assert [m.label for m in experiment.models] == ["ping/ping-1"]
    assert experiment.loops == (Loop("standard"), Loop("minimal-first"))
    assert experiment.repeats == 2 and experiment.limits == Limits() and experiment.retries == 2


def test_the_shipped_files_load():
    smallest = load_experiment(ROOT / "examples" / "experiments" / "smallest.yml")
    assert smallest.name == "smallest" and smallest.repeats == 2
    fix = load_experiment(ROOT / "examples" / "experiments" / "fix-files" / "experiment.yml")
    assert [s.id for s in fix.tasks[0].samples] == ["greeting", "config-port", "calc-add", "sum", "docs-index"]
    assert fix.tasks[0].samples[3].files == {
        "data/numbers.txt": FileSource(path=ROOT / "examples/experiments/fix-files/files/data/numbers.txt")
    }
    assert [m.price for m in fix.models] == [Price(2, 8), Price(9, 27)]
    assert fix.compare == (("deepseek/deepseek-v4-flash x standard", "deepseek/deepseek-v4-pro x minimal-first"),)


def test_models_as_strings_params_prices_and_loops_with_drivers():
    experiment = parse_experiment(
        {**SMALLEST, "models": ["ping/ping-1", {"provider": "p", "model": "m", "params": {"max_tokens": 99}}],
         "loops": [{"loop": "standard", "driver": "default"}], "prices": {"p/m": {"input": 1, "output": 2.5}},
         "concurrency": {"default": 3, "p": 7}, "limits": {"turns": 4, "tokens": 1000, "time": 1.5, "budget": 2}},
        base=ROOT, default_name="x",
    )  # fmt: skip
    ping, other = experiment.models
    assert (ping.provider, ping.model, ping.price) == ("ping", "ping-1", None)
    assert other.agent_options() == {"provider": "p", "model": "m", "max_tokens": 99}
    assert other.price == Price(1, 2.5)
    assert experiment.loops == (Loop("standard", "default"),) and experiment.loops[0].label == "standard@default"
    assert (experiment.concurrency.limit("p"), experiment.concurrency.limit("ping")) == (7, 3)
    assert experiment.limits == Limits(turns=4, tokens=1000, time=1.5, budget=2.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": ["ping/ping-1"]}, "unknown key model; known keys: name, tasks, scorer, models, loops, repeats, "
         "limits, concurrency, retries, currency, prices, compare, providers"),
        ({"tasks": []}, "tasks must be a non-empty list, got []"),
        ({"tasks": [{"input": "x", "target": "y"}]}, "tasks[0].id is required"),
        ({"tasks": [{"id": "a", "target": "y"}]},
         "tasks[0] needs exactly one of input (one sample), samples or dataset; got none"),
        ({"tasks": [{"id": "a", "input": "x", "target": "y"}, {"id": "a", "input": "z", "target": "y"}]},
         "tasks[1] repeats tasks[0] ('a')"),
        ({"tasks": [{"id": "a", "samples": [{"input": "x", "target": 3}]}]},
         "tasks[0].samples[0].target must be a string or a non-empty list of strings, got 3"),
        ({"tasks": [{"id": "a", "samples": [{"id": 1, "input": "x", "target": "t"}, {"id": "1", "input": "y", "target": "t"}]}]},
         "tasks[0]: sample id '1' is used twice (samples 1 and 2)"),
        ({"tasks": [{"id": "a", "input": "x"}]}, "tasks[0] sample '1' has no target, which the includes scorer needs"),
        ({"tasks": [{"id": "a", "input": "x", "target": "t", "files": {"../up.txt": {"text": "no"}}}]},
         "tasks[0].files key '../up.txt' must be a relative path inside the working directory"),
        ({"tasks": [{"id": "a", "input": "x", "target": "t", "files": {"f": "missing.txt"}}]},
         f"tasks[0].files.f: {ROOT / 'missing.txt'} does not exist"),
        ({"scorer": "fuzzy"}, "scorer must be one of exact, includes, regex or a mapping with a kind (python, judge, ...), "
         "got 'fuzzy'"),
        ({"scorer": {"kind": "python"}}, "scorer.function is required"),
        ({"scorer": {"kind": "python", "function": "no_colon"}},
         "scorer.function must be a reference 'module:function', got 'no_colon'"),
        ({"scorer": {"kind": "regex", "pattern": "("}},
         "scorer.pattern is not a valid regular expression: missing ), unterminated subpattern at position 0"),
        ({"scorer": {"kind": "judge", "provider": "ping"}}, "scorer.model is required"),
        ({"scorer": {"kind": "judge", "provider": "p", "model": "m", "prompt": "Grade {answer} as {json}"}},
         "scorer.prompt: only {input}, {target} and {answer} may stand in braces (write {{ and }} for a brace "
         "itself): KeyError 'json'"),
        ({"models": [{"provider": "ping"}]}, "models[0].model is required"),
        ({"models": ["ping"]}, "models[0] must be 'provider/model' or a mapping {provider, model, ...}, got 'ping'"),
        ({"models": ["ping/ping-1", {"provider": "ping", "model": "ping-1"}]}, "models[1] repeats models[0] ('ping/ping-1')"),
        ({"models": [{"provider": "ping", "model": "ping-1", "params": {"temperature": 0}}]},
         "unknown key models[0].params.temperature; known keys: max_tokens, reasoning_effort, system_prompt"),
        ({"models": [{"provider": "ping", "model": "ping-1", "params": {"max_tokens": 0}}]},
         "models[0].params.max_tokens must be a positive integer, got 0"),
        ({"models": [{"provider": "ping", "model": "ping-1", "price": {"input": -1, "output": 0}}]},
         "models[0].price.input must be a number >= 0, got -1"),
        ({"loops": ["Standard"]}, "loops[0] must be a loop id (matching ^[a-z0-9][a-z0-9._-]*$), got 'Standard'"),
        ({"repeats": True}, "repeats must be a positive integer, got True"),
        ({"limits": {"turns": 0}}, "limits.turns must be a positive integer, got 0"),
        ({"limits": {"time": "1m"}}, "limits.time must be a number > 0, got '1m'"),
        ({"limits": {"steps": 3}}, "unknown key limits.steps; known keys: turns, tokens, time, budget"),
        ({"concurrency": {"deepseek": 0}}, "concurrency.deepseek must be a positive integer, got 0"),
        ({"retries": -1}, "retries must be an integer >= 0, got -1"),
        ({"compare": [[{"model": "ping/ping-1", "loop": "standard"}, {"model": "ping/ping-2", "loop": "standard"}]]},
         "compare[0][1].model 'ping/ping-2' is not one of the models: ping/ping-1"),
        ({"name": "has.dot"}, "name must be a run name matching [A-Za-z0-9][A-Za-z0-9_-]{0,63} (it defaults to the "
         "file's name), got 'has.dot'"),
    ],
)  # fmt: skip
def test_mistakes_are_named_by_their_path(change, message):
    rejects({**SMALLEST, **change}, message)


@pytest.mark.parametrize(
    "change, path",
    [
        ({"name": "x" * 1_000_000}, "name must be a run name"),
        ({"repeats": ["x" * 1_000_000] * 1_000}, "repeats must be a positive integer"),
        ({"tasks": [{"id": "t", "input": "x", "target": "x", "files": {"a": {"text": list(range(100_000))}}}]},
         "tasks[0].files.a.text must be a string"),
    ],
)  # fmt: skip
def test_huge_values_are_quoted_cut_short(change, path):
    with pytest.raises(ExperimentError) as info:
        parse_experiment({**SMALLEST, **change}, base=ROOT, default_name="x")
    message = str(info.value)
    assert message.startswith(path) and len(message) <= 1_000, message[:300]


def test_a_dataset_error_names_the_file_and_line(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"input": "a", "target": "b"}\n\n{"input": "", "target": "b"}\n')
    rejects({**SMALLEST, "tasks": [{"id": "t", "dataset": "d.jsonl"}]},
            "tasks[0].dataset (d.jsonl line 3).input must be a non-empty string, got ''", base=tmp_path)  # fmt: skip
    (tmp_path / "d.jsonl").write_text('{"input": "a", "target": "b"}\nnot json\n')
    with pytest.raises(ExperimentError, match=r"tasks\[0\]\.dataset \(d\.jsonl line 2\): not JSON"):
        parse_experiment({**SMALLEST, "tasks": [{"id": "t", "dataset": "d.jsonl"}]}, base=tmp_path, default_name="x")


def test_a_dataset_numbers_its_samples_and_resolves_files_beside_itself(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "seed.txt").write_text("seed")
    (tmp_path / "data" / "d.jsonl").write_text(
        '{"input": "a", "target": ["b", "c"], "files": {"in/seed.txt": "seed.txt"}}\n{"id": 7, "input": "x", "target": "y"}\n'
    )
    experiment = parse_experiment({**SMALLEST, "tasks": [{"id": "t", "dataset": "data/d.jsonl", "files": {"shared.txt": {"text": "s"}}}]},
                                  base=tmp_path, default_name="x")  # fmt: skip
    first, second = experiment.tasks[0].samples
    assert (first.id, first.target, second.id) == ("1", ("b", "c"), "7")
    assert first.files == {"shared.txt": FileSource(text="s"), "in/seed.txt": FileSource(path=tmp_path / "data" / "seed.txt")}


def test_file_errors_name_the_file(tmp_path):
    path = tmp_path / "e.yml"
    path.write_text("tasks: []\ntasks: []\n")
    with pytest.raises(ExperimentError, match=r"e\.yml: line 2, column 1: found duplicate key 'tasks' \(first given on line 1\)"):
        load_experiment(path)
    path.write_text("tasks: [{id: a, input: x, target: y}]\nscorer: includes\nmodels: [ping/ping-1]\nloops: [standard]\nrepeats: 0\n")
    with pytest.raises(ExperimentError) as info:
        load_experiment(path)
    assert str(info.value) == f"{path}: repeats must be a positive integer, got 0"
    with pytest.raises(ExperimentError, match="experiment file .*nope.yml not found"):
        load_experiment(tmp_path / "nope.yml")


def test_two_adapter_factories_for_one_provider_are_refused():
    # The adapter is registered per provider: the second factory used to be ignored.
    models = [{"provider": "s", "model": "a", "adapter": "m:one"}, {"provider": "s", "model": "b", "adapter": "m:two"}]
    rejects({**SMALLEST, "models": models},
            "models[1].adapter m:two differs from models[0].adapter m:one, but both are provider 's', which has "
            "one adapter: give each factory its own provider name")  # fmt: skip
    same = [{**models[0]}, {**models[1], "adapter": "m:one"}]
    assert len(parse_experiment({**SMALLEST, "models": same}, base=ROOT, default_name="x").models) == 2


def test_a_csv_dataset_gives_samples_and_names_a_malformed_row(tmp_path):
    (tmp_path / "d.csv").write_text('id,input,target,level\nq1,"What is 2+2, in words?",four,easy\n,Say hi,hi,hard\n')
    task = {"id": "t", "dataset": {"csv": "d.csv"}, "files": {"shared.txt": {"text": "s"}}}
    first, second = parse_experiment({**SMALLEST, "tasks": [task]}, base=tmp_path, default_name="x").tasks[0].samples
    assert (first.id, first.input, first.target, first.metadata) == ("q1", "What is 2+2, in words?", ("four",),
                                                                    {"level": "easy"})  # fmt: skip
    assert (second.id, second.input, second.target, second.metadata) == ("2", "Say hi", ("hi",), {"level": "hard"})
    assert second.files == {"shared.txt": FileSource(text="s")}
    (tmp_path / "d.csv").write_text("input,target\na,b\nc,d,e\n")
    rejects({**SMALLEST, "tasks": [task]}, "tasks[0].dataset.csv (d.csv row 3): 3 fields, the header has 2",
            base=tmp_path)  # fmt: skip
    (tmp_path / "d.csv").write_text("input,target\na,b\n ,d\n")
    rejects({**SMALLEST, "tasks": [task]}, "tasks[0].dataset.csv (d.csv row 3): input is empty", base=tmp_path)
    (tmp_path / "d.csv").write_text("question,answer\na,b\n")
    rejects({**SMALLEST, "tasks": [task]},
            "tasks[0].dataset.csv: d.csv needs a header row with an input column, got ['question', 'answer']",
            base=tmp_path)  # fmt: skip


def test_an_inspect_dataset_gives_samples_and_names_what_it_cannot_replay(tmp_path):
    import json

    records = [
        {"id": 7, "input": "What is 2+2?", "target": "4", "metadata": {"level": "easy"}},
        {"input": [{"role": "system", "content": "Answer in one word."},
                   {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]}],
         "target": ["Paris", "paris"]},
        {"id": "mc", "input": "Which is a prime?", "choices": ["4", "7", "9"], "target": "B"},
    ]  # fmt: skip
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    task = {"id": "t", "dataset": {"inspect": "d.jsonl"}}
    plain, chat, choice = parse_experiment({**SMALLEST, "tasks": [task]}, base=tmp_path, default_name="x").tasks[0].samples
    assert (plain.id, plain.input, plain.target, plain.metadata) == ("7", "What is 2+2?", ("4",), {"level": "easy"})
    assert (chat.id, chat.input, chat.target) == ("2", "Answer in one word.\n\nCapital of France?", ("Paris", "paris"))
    assert (choice.id, choice.input, choice.target) == ("mc", "Which is a prime?\n\nA) 4\nB) 7\nC) 9", ("B",))

    def refused(record: dict, message: str) -> None:
        (tmp_path / "d.jsonl").write_text(json.dumps(records[0]) + "\n" + json.dumps(record) + "\n")
        with pytest.raises(ExperimentError) as info:
            parse_experiment({**SMALLEST, "tasks": [task]}, base=tmp_path, default_name="x")
        assert info.value.code == "INVALID_EXPERIMENT"
        assert str(info.value).startswith(f"tasks[0].dataset.inspect (d.jsonl line 2){message}"), str(info.value)

    refused({"input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            ".input[1]: a 'assistant' message cannot be replayed as an agent's input")  # fmt: skip
    refused({"input": [{"role": "system", "content": "be brief"}]}, ".input holds no user message")
    refused({"input": [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]},
            ".input[0].content: only text parts can be sent to an agent")  # fmt: skip
    refused({"input": "q", "sandbox": "docker"}, ": Inspect's 'sandbox' is not supported")
    refused({"input": "q", "choices": []}, ".choices must be a list of 1 to 26 strings")
    (tmp_path / "d.jsonl").write_text(json.dumps({"input": "q", "answer": "a"}) + "\n")
    rejects({**SMALLEST, "tasks": [task]}, "unknown key tasks[0].dataset.inspect (d.jsonl line 1).answer; known keys: "
            "id, input, target, choices, metadata", base=tmp_path)  # fmt: skip
    (tmp_path / "d.jsonl").write_text("{not json\n")
    with pytest.raises(ExperimentError, match=r"^tasks\[0\]\.dataset\.inspect \(d\.jsonl line 1\): not JSON"):
        parse_experiment({**SMALLEST, "tasks": [task]}, base=tmp_path, default_name="x")
