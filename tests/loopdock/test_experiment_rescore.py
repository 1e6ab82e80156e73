"""``experiment rescore``: a changed scorer applied to finished rollouts from their sessions,
without calling the rollouts' model again; the report then shows the new scores."""

from __future__ import annotations

import json

from loopdock.runtime._store import SessionStore

SCORERS = """\
def lenient(state):
    return 1.0 if "pong" in state.answer else 0.0


def strict(state):
    # Partial credit, and only where the agent's working directory is still there.
    return 0.25 if state.answer.startswith("pong: ") and state.workdir.is_dir() else 0.0
"""


def experiment_file(tmp_path, function, name="tiny"):
    path = tmp_path / f"{name}-{function}.yml"
    path.write_text(f"{{name: {name}, tasks: [{{id: greet, input: hello, target: pong}}], "
                    f"scorer: {{kind: python, function: 'grade:{function}'}}, "
                    "models: [{provider: ping, model: ping-1}], loops: [standard, minimal-first], repeats: 2}\n")  # fmt: skip
    return path


def model_replies(home):
    with SessionStore.open(home / "sessions.db") as store:
        return sum(e.type == "assistant/message" for h in store.list_headers() for e in store.load(h.id)[1])


def cell_scores(main, capsys, home):
    assert main(["experiment", "report", "tiny", "--home", str(home), "--json"]) == 0
    return [(c["loop"], c["score"], c["rollouts"]) for c in json.loads(capsys.readouterr().out)["cells"]]


def test_rescore_applies_a_changed_scorer_without_calling_the_model(tmp_path, capsys, main):
    (tmp_path / "grade.py").write_text(SCORERS)
    home = tmp_path / "home"
    assert main(["experiment", "run", str(experiment_file(tmp_path, "lenient")), "--home", str(home)]) == 0
    capsys.readouterr()
    assert cell_scores(main, capsys, home) == [("standard", 1.0, 2), ("minimal-first", 1.0, 2)]
    replies = model_replies(home)

    strict = experiment_file(tmp_path, "strict")
    assert main(["experiment", "rescore", str(strict), "--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert "experiment tiny: rescored 4 rollouts (4 changed), 0 failed" in out
    assert model_replies(home) == replies  # no model was called
    assert cell_scores(main, capsys, home) == [("standard", 0.25, 2), ("minimal-first", 0.25, 2)]
    # The new scorer is the run's now: a resume with the edited file is not refused, and runs nothing.
    assert main(["experiment", "run", str(strict), "--home", str(home), "--resume"]) == 0
    assert "0 scored now" in capsys.readouterr().out
    assert model_replies(home) == replies


def test_rescore_refuses_an_unknown_run_or_scorer(tmp_path, capsys, main):
    (tmp_path / "grade.py").write_text(SCORERS)
    home = tmp_path / "home"
    assert main(["experiment", "rescore", str(experiment_file(tmp_path, "strict")), "--home", str(home)]) == 2
    assert "UNKNOWN_RUN" in capsys.readouterr().err
    assert main(["experiment", "run", str(experiment_file(tmp_path, "lenient")), "--home", str(home)]) == 0
    capsys.readouterr()
    assert main(["experiment", "rescore", str(experiment_file(tmp_path, "strict", name="other")), "--home",
                 str(home)]) == 2  # fmt: skip
    assert "no experiment run 'other'" in capsys.readouterr().err
    assert main(["experiment", "rescore", str(experiment_file(tmp_path, "missing")), "--home", str(home)]) == 2
    assert "scorer function 'grade:missing'" in capsys.readouterr().err
    assert cell_scores(main, capsys, home) == [("standard", 1.0, 2), ("minimal-first", 1.0, 2)]


STOPS_SECOND_TIME = """\
from pathlib import Path

MARK = Path(__file__).with_name("scored-once")


def strict_then_ctrl_c(state):
    if MARK.exists():
        raise KeyboardInterrupt  # Ctrl-C, as the second rollout is being scored
    MARK.write_text("")
    return 0.25
"""


def test_an_interrupted_rescore_is_refused_by_report_and_resume_until_run_again(tmp_path, capsys, main):
    (tmp_path / "grade.py").write_text(SCORERS + "\n\n" + STOPS_SECOND_TIME)
    home = tmp_path / "home"
    lenient = experiment_file(tmp_path, "lenient")
    assert main(["experiment", "run", str(lenient), "--home", str(home)]) == 0
    capsys.readouterr()

    stopping = experiment_file(tmp_path, "strict_then_ctrl_c")
    assert main(["experiment", "rescore", str(stopping), "--home", str(home)]) == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted: the run's scores now mix the old scorers and the new; finish with: "
                          f"loopdock experiment rescore {stopping} --home {home}")  # fmt: skip
    assert "Traceback" not in err
    # One rollout holds the new score, the others the old: neither a report nor a resume may use that.
    assert main(["experiment", "report", "tiny", "--home", str(home)]) == 2
    assert "RESCORE_INTERRUPTED" in capsys.readouterr().err
    assert main(["experiment", "run", str(lenient), "--home", str(home), "--resume"]) == 2
    assert "RESCORE_INTERRUPTED" in capsys.readouterr().err

    assert main(["experiment", "rescore", str(experiment_file(tmp_path, "strict")), "--home", str(home)]) == 0
    assert "rescored 4 rollouts" in capsys.readouterr().out
    assert cell_scores(main, capsys, home) == [("standard", 0.25, 2), ("minimal-first", 0.25, 2)]
