"""The experiment runner's one error class; ``code`` says which rule was broken."""

from __future__ import annotations

from typing import Literal

from loopdock.runtime import LoopdockError

ExperimentErrorCode = Literal[
    "INVALID_EXPERIMENT",
    "BUDGET_EXCEEDED",
    "UNKNOWN_RUN",
    "MISSING_EXTRA",
    "RESCORE_INTERRUPTED",
]


class ExperimentError(LoopdockError):
    """Raised by ``loopdock experiment``; ``code`` says which rule was broken:

    - INVALID_EXPERIMENT: a malformed experiment file or dataset (the message names the
      exact field path, e.g. ``models[1].price.input must be a number >= 0``), or one
      that names a provider, loop or scorer function that does not exist;
    - BUDGET_EXCEEDED: the cost estimate of what is left to run is over ``limits.budget``
      (raised before anything starts);
    - UNKNOWN_RUN: a report or export names a run the runtime home does not hold;
    - MISSING_EXTRA: an optional part needs a package that is not installed (the
      message says which ``pip install`` brings it);
    - RESCORE_INTERRUPTED: a report, export or resume of a run whose last rescore did not
      finish (its scores mix old and new scorers): run the rescore again.
    """

    def __init__(self, code: ExperimentErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
