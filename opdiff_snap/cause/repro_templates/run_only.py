"""Export and load around a backend family's repro code that defines only `run(module,
inputs)`."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the family's runner
    from .generated import run

# ---------------------------------------------------------------- script text


def export(module, inputs):
    """This family's code is one run(): export and load happen inside it."""
    return module


def load(module):
    return lambda inputs: run(module, inputs)
