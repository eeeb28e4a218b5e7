"""The names a repro script's writer (cause/repro.py) generates around the templates,
declared for the type checker."""

from pathlib import Path
from typing import Any, Callable

import torch

HERE: Path
ATOL: float
RTOL: float
PRESET: dict[str, Any]

# the verdicts a script can reach
PASS: str
MISMATCH: str
SHAPE_MISMATCH: str
STRUCTURE_MISMATCH: str
EXPORT_FAIL: str
LOAD_FAIL: str
INFER_FAIL: str

# the bias bound's parameters (compare/bounds.py)
BIAS_MIN_ELEMENTS: int
BIAS_SHIFT: float
DRIFT_CLIP: float
DRIFT_BOUND: float
T_QUANTILE: tuple[float, ...]

def load_data() -> dict[str, Any]: ...
def make_args(t: tuple[torch.Tensor, ...]) -> tuple[list[Any], dict[str, Any]]: ...
def build(data: dict[str, Any]) -> Any: ...

# the backend family's runner (its `repro_source`): export and load, or run alone
def run(module: torch.nn.Module, inputs: list[torch.Tensor]) -> Any: ...
def export(module: torch.nn.Module, inputs: list[torch.Tensor]) -> Any: ...
def load(artifact: Any) -> Callable[[list[torch.Tensor]], Any]: ...
