"""Fixtures for the lowering survey and delegation: a suite (suite.yaml) whose modules
(models.py) hold two ops each that one backend cannot take, and one op XNNPACK leaves to
the portable kernels."""

from pathlib import Path

SUITE = Path(__file__).resolve().parent / "suite.yaml"
MODELS = SUITE.parent / "models.py"


def line_of(marker: str) -> int:
    lines = MODELS.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)
