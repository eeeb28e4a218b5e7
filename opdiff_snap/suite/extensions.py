"""Our extensions to a test (tolerance, seeds, tags, skip, grad, profiles), validated into
their canonical JSON form."""

from __future__ import annotations

import re
from typing import Any, Callable

from .fields import PRECISIONS, TOLERANCE_KEYS
from .problems import BAD, Problems, Where, check_keys
from .profiles import PROFILES, expand

_KEY_RE = re.compile(r"^[A-Za-z0-9_.*?\[\]-]+$")


def _tol_pair(raw: Any, where: Where, problems: Problems, num: Callable) -> Any:
    if not isinstance(raw, dict):
        return problems.add(where, f"expected {{atol: ..., rtol: ...}}, got {raw!r}")
    check_keys(raw, TOLERANCE_KEYS, where, problems, "a tolerance")
    if not raw or any(k not in TOLERANCE_KEYS for k in raw):
        return BAD if raw else problems.add(where, "a tolerance needs atol, rtol, baseline_factor, "
                                                   "precision_factor, steps and/or min_sqnr")
    vals = {k: num(raw[k], where.at(raw, k), minimum=None if k == "min_sqnr" else 0) for k in TOLERANCE_KEYS
            if k in raw}
    if BAD in vals.values():
        return BAD
    out = {"atol": float(vals["atol"]) if "atol" in vals else None,
           "rtol": float(vals["rtol"]) if "rtol" in vals else None}
    for factor in ("baseline_factor", "precision_factor", "steps", "min_sqnr"):
        if factor in vals:  # only when given: definitions (and spec hashes) stay as they were
            out[factor] = float(vals[factor])
    return out


def parse_extension(key: str, raw: Any, where: Where, problems: Problems,
                    num: Callable) -> Any:
    """Validate one extension field; returns its canonical JSON form or BAD."""
    if key == "tolerance":
        if isinstance(raw, dict) and raw and set(raw) <= set(TOLERANCE_KEYS):
            t = _tol_pair(raw, where, problems, num)
            return BAD if t is BAD else {"*": t}
        if not isinstance(raw, dict) or not raw:
            return problems.add(where, "tolerance must be {atol, rtol} or a mapping of precision "
                                       f"({', '.join(PRECISIONS)}), preset name or glob to {{atol, rtol}}")
        out = {}
        for k, v in raw.items():
            if not isinstance(k, str) or not _KEY_RE.match(k):
                problems.add(where.key(raw, k), f"{k!r} is not a precision, preset name or glob")
                continue
            out[k] = _tol_pair(v, where.at(raw, k), problems, num)
        return BAD if BAD in out.values() or len(out) != len(raw) else out
    if key == "seeds":
        if isinstance(raw, int) and not isinstance(raw, bool):
            if raw < 1:
                return problems.add(where, f"seeds={raw}: give a positive count or a list of seeds")
            return list(range(raw))
        if isinstance(raw, list) and raw and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                 for s in raw):
            if len(set(raw)) != len(raw):
                return problems.add(where, f"seeds {raw} repeat a seed")
            return list(raw)
        return problems.add(where, f"seeds must be a positive count or a non-empty list of "
                                   f"non-negative ints, got {raw!r}")
    if key == "tags":
        if isinstance(raw, list) and all(isinstance(t, str) and t for t in raw):
            return list(raw)
        return problems.add(where, f"tags must be a list of strings, got {raw!r}")
    if key == "skip":
        if isinstance(raw, dict) and all(isinstance(k, str) and _KEY_RE.match(k) and isinstance(v, str) and v
                                         for k, v in raw.items()):
            return dict(raw)
        return problems.add(where, "skip must map a preset name or glob to a reason string, e.g. "
                                   "{coreml_*: 'complex not supported'}")
    if key == "grad":
        if isinstance(raw, bool):
            return raw
        return problems.add(where, f"grad must be true or false, got {raw!r}")
    if key == "profiles":
        return _profiles(raw, where, problems)
    raise KeyError(key)


def _profiles(raw: Any, where: Where, problems: Problems) -> Any:
    names = ", ".join(PROFILES)
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        return problems.add(where, f"profiles must be a non-empty list of input profiles ({names}, or edge for "
                                   f"every one but normal), got {raw!r}")
    try:
        return expand(raw)
    except ValueError as exc:
        return problems.add(where, f"'{exc}' is not an input profile: use {names}, or edge for every one but "
                                   "normal")
