"""Project settings: embedded defaults, overridden by `[tool.opdiff]` in pyproject.toml,
overridden by command-line flags. The goldens, store and cache locations are local paths
or s3://bucket/prefix URLs (kept as strings)."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from . import limits
from .errors import OpdiffError, suggest
from .limits import setting
from .locations import parse_location

LOCATIONS = ("goldens", "store", "cache")   # may be s3:// URLs
# the numeric settings and their ranges (the same as their flags')
NUMBERS = {"jobs": limits.JOBS, "threads": limits.THREADS, "timeout_s": limits.TIMEOUT_S,
           "repeats": limits.REPEATS, "warmup": limits.WARMUP, "batch": limits.BATCH,
           "query_timeout_s": limits.TIMEOUT_S}


@dataclass(frozen=True)
class Settings:
    suites: Path = Path("suites")
    goldens: Path | str = Path("goldens")
    store: Path | str = Path("store")
    cache: Path | str = Path(".opdiff-cache")
    jobs: int = os.cpu_count() or 1
    # intra-op threads of every job: fixed, so neither -j nor the machine's core count changes
    # a backend's summation order, and so never a verdict or a metric
    threads: int = 1
    timeout_s: float = 300.0
    repeats: int = 5
    warmup: int = 1
    # tests one exporter call may compile together (execution/batch.py); 1: each alone
    batch: int = 16
    executor: str = "local"   # local | ray | ray://HOST:PORT (parse_executor)
    s3_endpoint: str | None = None   # an S3-compatible service other than AWS (sets AWS_ENDPOINT_URL)
    query_timeout_s: float = 300.0   # one SQL statement over the history (query, reports)
    query_memory_limit: int | None = None   # bytes for that SQL; None: half of this machine's memory
    # bytes one worker process may hold (resident) before its job is stopped; None: 3/4 of this
    # machine's memory shared by the workers (pool.default_worker_memory)
    worker_memory_limit: int | None = None
    # results known not to pass (expectations/): a missing file at this path means none
    expectations: Path = Path("expectations.yaml")
    # an expected failure that now passes fails the run (False: a warning)
    strict_expectations: bool = True

    def with_overrides(self, **values: Any) -> "Settings":
        """Replace the fields whose value is not None."""
        given = {k: v for k, v in values.items() if v is not None}
        if "suites" in given:
            given["suites"] = Path(given["suites"])
        for key in LOCATIONS:
            if key in given:
                given[key] = parse_location(given[key])
        return replace(self, **given)


def apply_endpoint(settings: Settings) -> None:
    """Make the S3 endpoint setting reach every S3 client of this process and its workers
    (through the standard AWS_ENDPOINT_URL variable)."""
    if settings.s3_endpoint:
        os.environ["AWS_ENDPOINT_URL"] = settings.s3_endpoint


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
        if name == "s3_endpoint":
            if not isinstance(value, str) or not value.startswith(("http://", "https://")):
                raise OpdiffError(f"{pyproject}: [tool.opdiff] {key} must be the URL of an S3-compatible "
                                  f"service such as 'https://s3.example.com', not {value!r}.")
        elif isinstance(default, Path):
            if not isinstance(value, str) or not value:
                raise OpdiffError(f"{pyproject}: [tool.opdiff] {key} must be a path (a non-empty string), "
                                  f"not {value!r}.")
            if name in LOCATIONS:
                try:
                    where = parse_location(value)
                except OpdiffError as exc:
                    raise OpdiffError(f"{pyproject}: [tool.opdiff] {key}: {exc}") from None
                value = where if isinstance(where, str) else pyproject.parent / where
            else:
                value = pyproject.parent / value
        elif name in ("query_memory_limit", "worker_memory_limit"):
            try:
                value = memory_size(value)
            except ValueError as exc:
                raise OpdiffError(f"{pyproject}: [tool.opdiff] {key}: {exc}") from None
        elif name == "executor":
            parse_executor(value, f"{pyproject}: [tool.opdiff] {key}")
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise OpdiffError(f"{pyproject}: [tool.opdiff] {key} must be true or false, not {value!r}.")
        elif isinstance(default, (int, float)):
            value = setting(f"{pyproject}: [tool.opdiff] {key}", value, NUMBERS[name])
        values[name] = value
    return replace(settings, **values)


_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgt]i?)?b\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def memory_size(text: object) -> int:
    """Bytes from a size such as '512MB', '2GB' or '1.5GiB' (KB = 1000 bytes, KiB = 1024,
    as DuckDB reads them). Raises ValueError saying what is expected."""
    m = _SIZE.fullmatch(text) if isinstance(text, str) else None
    size = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()]) if m else 0
    if not m:
        raise ValueError(f"{text!r} is not a memory size; give a number with a unit, such as 512MB, "
                         "2GB or 1.5GiB.")
    if size < 2**20:
        raise ValueError(f"{text!r} is too small to run a query in; give at least 1MiB, such as 512MB.")
    return size


def usable_memory() -> int:
    """The memory this process may use: the machine's, or its cgroup's if lower (8 GiB when
    neither can be read)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 * 2**30
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            total = min(total, int(f.read().strip()))
    except (OSError, ValueError):
        pass   # no cgroup v2 limit ("max"), or not Linux
    return total


def memory_text(size: int) -> str:
    """A size in bytes as the largest unit that writes it without a fraction ('512MB',
    '2GiB'), else in GiB or MiB with one decimal."""
    for unit, factor in (("TiB", 2**40), ("TB", 10**12), ("GiB", 2**30), ("GB", 10**9), ("MiB", 2**20),
                         ("MB", 10**6), ("KiB", 2**10), ("KB", 10**3)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size / 2**30:.1f}GiB" if size >= 2**30 else f"{size / 2**20:.1f}MiB"


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
