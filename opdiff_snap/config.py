"""Project settings: embedded defaults, overridden by `[tool.opdiff]` in pyproject.toml,
overridden by command-line flags."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from .errors import OpdiffError, suggest


@dataclass(frozen=True)
class Settings:
    suites: Path = Path("suites")
    goldens: Path = Path("goldens")
    store: Path = Path("store")
    cache: Path = Path(".opdiff-cache")
    jobs: int = os.cpu_count() or 1
    timeout_s: float = 300.0
    repeats: int = 5
    warmup: int = 1
    executor: str = "local"   # local | ray | ray://HOST:PORT (parse_executor)

    def with_overrides(self, **values: Any) -> "Settings":
        """Replace the fields whose value is not None."""
        given = {k: v for k, v in values.items() if v is not None}
        for key in ("suites", "goldens", "store", "cache"):
            if key in given:
                given[key] = Path(given[key])
        return replace(self, **given)


def find_pyproject(start: Path) -> Path | None:
    for d in [start, *start.parents]:
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_settings(start: Path | None = None) -> Settings:
    """Defaults, then `[tool.opdiff]` of the nearest pyproject.toml (paths in it are
    relative to that file's directory)."""
    start = (start or Path.cwd()).resolve()
    pyproject = find_pyproject(start)
    settings = Settings()
    if pyproject is None:
        return settings
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise OpdiffError(f"{pyproject}: not valid TOML ({exc}). Fix the file or run from another directory.") from None
    except OSError as exc:
        raise OpdiffError(f"{pyproject}: cannot read it ({exc.strerror or exc}). Fix its permissions or run "
                          "from another directory.") from None
    table = data.get("tool", {}).get("opdiff", {})
    if not isinstance(table, dict):
        raise OpdiffError(f"{pyproject}: [tool.opdiff] must be a table.")
    known = {f.name: f for f in fields(Settings)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in known:
            raise OpdiffError(f"{pyproject}: [tool.opdiff] has an unknown key '{key}'{suggest(name, known)}; "
                              f"valid keys: {', '.join(sorted(known))}.")
        default = getattr(settings, name)
        if isinstance(default, Path):
            if not isinstance(value, str) or not value:
                raise OpdiffError(f"{pyproject}: [tool.opdiff] {key} must be a path (a non-empty string), "
                                  f"not {value!r}.")
            value = pyproject.parent / value
        elif name == "executor":
            parse_executor(value, f"{pyproject}: [tool.opdiff] {key}")
        elif isinstance(default, (int, float)):
            value = _number(pyproject, key, value, whole=isinstance(default, int),
                            minimum=0 if name == "warmup" else (1 if isinstance(default, int) else None))
        values[name] = value
    return replace(settings, **values)


def _number(pyproject: Path, key: str, value: Any, whole: bool, minimum: int | None) -> int | float:
    """A numeric setting: whole numbers >= minimum, or numbers > 0 when minimum is None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and whole:
        ok = isinstance(value, int) and value >= (minimum or 0)
    elif ok:
        ok = value > 0 and value == value and value != float("inf")
    if not ok:
        want = f"a whole number >= {minimum}" if whole else "a number > 0"
        raise OpdiffError(f"{pyproject}: [tool.opdiff] {key} must be {want}, not {value!r}.")
    return value


_ADDRESS = re.compile(r"auto|(\[[0-9A-Fa-f:]+\]|[A-Za-z0-9][A-Za-z0-9_.-]*):[0-9]{1,5}")


def parse_executor(spec: object, where: str = "--executor") -> tuple[str, str | None]:
    """Where jobs run: ("local", None) for worker processes on this machine, ("ray", None)
    for a Ray instance of our own on this machine, ("ray", "HOST:PORT") to join the Ray
    cluster whose head is there (or "auto": the one started on this machine)."""
    text = spec.strip() if isinstance(spec, str) else None
    if text in ("local", "ray"):
        return text, None
    if text and text.startswith("ray://") and _ADDRESS.fullmatch(text[len("ray://"):]):
        return "ray", text[len("ray://"):]
    raise OpdiffError(f"{where} {spec!r}: give local (worker processes here), ray (a Ray instance "
                      "started here) or ray://HOST:PORT (join the Ray cluster whose head listens there, "
                      "as `ray start --head` prints it; ray://auto for the one started on this machine).")
