"""The scorer of the fix-files tasks: the file a sample names (``metadata.check``) must
hold the target, compared line by line with surrounding whitespace ignored."""

from pathlib import Path

from loopdock.experiment import Score, ScoreInput


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()]


def file_matches(state: ScoreInput) -> Score:
    path = Path(state.workdir, state.metadata["check"])
    if not path.is_file():
        return Score(0.0, f"{path.name} was not written")
    got = _lines(path.read_text(encoding="utf-8", errors="replace"))
    if got == _lines(state.target[0]):
        return Score(1.0, f"{path.name} is right")
    return Score(0.0, f"{path.name} holds {got!r}, expected {_lines(state.target[0])!r}")
