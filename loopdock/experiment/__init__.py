"""Experiments: one task set across a model x loop matrix, resumable, with a report.

    from loopdock.experiment import load_experiment, run_experiment

    summary = trio.run(run_experiment, load_experiment("exp.yml"))

Every rollout (task, sample, model, loop, repeat) is one agent session in the runtime
home, so results, resumption and crash recovery all come from the session logs. The
command line: ``loopdock experiment run|report|export|bench``.
"""

from ._config import load_experiment as load_experiment
from ._config import parse_experiment as parse_experiment
from ._errors import ExperimentError as ExperimentError
from ._records import RolloutResult as RolloutResult
from ._runner import Progress as Progress
from ._runner import RunSummary as RunSummary
from ._runner import run_experiment as run_experiment
from ._runner import run_in_runtime as run_in_runtime
from ._scoring import Score as Score
from ._scoring import ScoreInput as ScoreInput
from ._spec import Experiment as Experiment
