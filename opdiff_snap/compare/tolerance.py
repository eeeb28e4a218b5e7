"""The tolerance policy: which tolerance a preset's outputs are compared with, and what one
output leaf is held to given its dtype."""

from __future__ import annotations

import fnmatch
from typing import Any, Mapping

import torch

from ..backends.base import Preset
from ..suite.model import Tolerance
from .rules import BASELINE_FACTOR

# torch.testing.assert_close defaults.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-5, rtol=1.3e-6),
    "fp16": Tolerance(atol=1e-5, rtol=1e-3),
    "bf16": Tolerance(atol=1e-5, rtol=1.6e-2),
}
FP64_TOLERANCE = Tolerance(atol=1e-7, rtol=1e-7)

_GLOB_CHARS = set("*?[")


def tolerance_for(case_tolerance: Any, preset: Preset, cli: Tolerance | None = None,
                  preset_override: Tolerance | None = None) -> Tolerance:
    """The tolerance to compare `preset`'s outputs with. Field by field (atol and rtol
    separately), the first source that sets the field wins:

    1. `cli` (--atol / --rtol)
    2. the test's/suite's tolerance keyed by the exact preset name
    3. ... keyed by a glob matching the preset name (the longest matching pattern first)
    4. ... keyed by the preset's precision (fp32, fp16, bf16)
    5. ... keyed "*" (the plain `{atol, rtol}` form)
    6. `preset_override`, then the preset's options `atol` / `rtol`
    7. DEFAULT_TOLERANCES[preset.precision] (torch.testing's defaults)

    `baseline_factor` (how many times the baseline's own rounding error is allowed)
    follows the same chain and defaults to BASELINE_FACTOR; `precision_factor` (how many
    times torch eager's own error at the target's precision) follows it too, and stays None
    when nothing sets it (compare.rules.PRECISION_FACTOR then decides, per precision).

    `steps` and `min_sqnr` (int8 presets only) follow it too; the preset's options hold
    their defaults (compare.int8_errors.STEPS where a backend's do not).

    `case_tolerance` is the `TestCase.tolerance` mapping (a TestCase is accepted too).
    """
    if hasattr(case_tolerance, "tolerance") and not isinstance(case_tolerance, Mapping):
        case_tolerance = case_tolerance.tolerance
    table: Mapping[str, Tolerance] = case_tolerance or {}
    chain: list[Tolerance | None] = [cli, table.get(preset.name)]
    globs = [k for k in table if k != "*" and k != preset.name and _GLOB_CHARS & set(k)
             and fnmatch.fnmatchcase(preset.name, k)]
    chain += [table[k] for k in sorted(globs, key=len, reverse=True)]
    chain += [table.get(preset.precision), table.get("*"), preset_override]
    opts = preset.options or {}
    chain.append(Tolerance(_opt_float(opts.get("atol")), _opt_float(opts.get("rtol")),
                           _opt_float(opts.get("baseline_factor")), steps=_opt_float(opts.get("steps")),
                           min_sqnr=_opt_float(opts.get("min_sqnr"))))
    chain.append(DEFAULT_TOLERANCES.get(preset.precision, DEFAULT_TOLERANCES["fp32"]))

    def pick(name: str) -> float | None:
        for t in chain:
            v = _field(t, name)
            if v is not None:
                return float(v)
        return None

    factor = pick("baseline_factor")
    quantized = preset.scheme is not None
    return Tolerance(atol=pick("atol"), rtol=pick("rtol"),
                     baseline_factor=BASELINE_FACTOR if factor is None else factor,
                     precision_factor=pick("precision_factor"),
                     # an int8 preset's own: nothing else is judged in quantization steps
                     steps=pick("steps") if quantized else None, min_sqnr=pick("min_sqnr") if quantized else None)


def _field(t: Any, name: str) -> Any:
    if t is None:
        return None
    if isinstance(t, Mapping):
        return t.get(name)
    return getattr(t, name, None)


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def leaf_tolerance(tol: Tolerance, dtype: torch.dtype) -> tuple[float, float]:
    """The tolerance one output leaf is held to.

    Fields left None fall back to the leaf dtype's default. A float16 / bfloat16 leaf is
    never held tighter than its own dtype's default: an op that computes in half precision
    (fp16 inputs, even on an fp32 preset) cannot be asked for more digits than the dtype
    has. A float64 leaf under the plain fp32 default gets torch.testing's float64 values."""
    if dtype in (torch.float64, torch.complex128):
        if tol == DEFAULT_TOLERANCES["fp32"]:
            return float(FP64_TOLERANCE.atol or 0.0), float(FP64_TOLERANCE.rtol or 0.0)
        default = FP64_TOLERANCE
    elif dtype in (torch.float16, torch.bfloat16):
        default = DEFAULT_TOLERANCES["fp16" if dtype == torch.float16 else "bf16"]
        atol = max(tol.atol if tol.atol is not None else 0.0, default.atol or 0.0)
        rtol = max(tol.rtol if tol.rtol is not None else 0.0, default.rtol or 0.0)
        return float(atol), float(rtol)
    else:
        default = DEFAULT_TOLERANCES["fp32"]
    atol_set = tol.atol if tol.atol is not None else default.atol
    rtol_set = tol.rtol if tol.rtol is not None else default.rtol
    return float(atol_set or 0.0), float(rtol_set or 0.0)

