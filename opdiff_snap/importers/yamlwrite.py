"""Write generated suites as compact, exact YAML: one flow mapping per test, and every
float in the shortest decimal that reads back to the same value of its own dtype
(numpy's shortest repr), spelled so YAML 1.1 reads it as a float."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np
import yaml

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def yaml_float(x: Any) -> str:
    """`x` (a numpy float of its own dtype, or a Python float) as a YAML float."""
    if isinstance(x, float) and not isinstance(x, np.floating):
        x = np.float64(x)
    if math.isnan(x):
        return ".nan"
    if math.isinf(x):
        return ".inf" if x > 0 else "-.inf"
    text = np.format_float_positional(x, unique=True, trim="0") if 1e-4 <= abs(float(x)) < 1e16 or x == 0 \
        else np.format_float_scientific(x, unique=True, trim="0", exp_digits=1)
    mantissa, e, exp = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    elif mantissa.endswith("."):
        mantissa += "0"
    if e and exp[0] not in "+-":
        exp = "+" + exp
    return mantissa + (("e" + exp) if e else "")


def flow(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return flow(value.tolist()) if value.dtype.kind in "biu" else _array(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return yaml_float(value)
    if isinstance(value, str):
        return value if _plain_string(value) else json.dumps(value)
    raise TypeError(f"cannot write {type(value).__name__} into a suite")


def _array(a: np.ndarray) -> str:
    if a.ndim == 0:
        return yaml_float(a[()])
    return "[" + ", ".join(_array(v) if a.ndim > 1 else yaml_float(v) for v in a) + "]"


def _key(k: Any) -> str:
    return k if isinstance(k, str) and _PLAIN_KEY.match(k) else json.dumps(str(k))


def _plain_string(s: str) -> bool:
    """A string YAML reads back as this same string when written bare."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.:-]*", s):
        return False
    return yaml.safe_load(s) == s


def dump_suite(header: str, defaults: dict, tests: list[dict]) -> str:
    lines = ["# " + line for line in _wrap(header)]
    lines += ["", f"defaults: {flow(defaults)}", "", "tests:"]
    for t in tests:
        head = flow({k: v for k, v in t.items() if k != "in"})
        inputs = ",\n          ".join(flow(n) for n in t["in"])
        lines.append(f"  - {head[:-1]},\n     in: [{inputs}]}}")
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int = 88) -> list[str]:
    out, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width - 2:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return out + ([line] if line else [])
