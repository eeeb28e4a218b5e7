"""The range of every number a user gives: command-line flags (through the click type
`Number`), `[tool.opdiff]` settings, the pytest plugin's options and numeric preset
options. A number is finite, within its range, and whole where a count is meant; one that
is not is refused where it is read, naming the flag, setting or option.

The upper bounds keep a number within what the machinery below can take: a timeout must
fit the millisecond counter of `poll`, a seed the history's BIGINT column, a count of
workers, repeats or seeds what one machine can hold in memory."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import click

from .errors import OpdiffError
from .safetext import printable


@dataclass(frozen=True)
class Range:
    """Numbers from `low` to `high` (either end may be open-ended: None), above `low`
    rather than at least `low` with `low_open`; only whole numbers with `whole`."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    whole: bool = False
    unit: str = ""    # what the number counts, for the message ("seconds")

    def describe(self) -> str:
        """'a whole number from 1 to 1024', 'a finite number > 0', ..."""
        kind = "a whole number" if self.whole else "a finite number"
        if self.unit:
            kind += f" of {self.unit}"
        low, high = _show(self.low), _show(self.high)
        if self.low is not None and self.high is not None and not self.low_open:
            return f"{kind} from {low} to {high}"
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {low}")
        if self.high is not None:
            parts.append(f"<= {high}")
        return f"{kind} {' and '.join(parts)}".rstrip()

    def problem(self, value: Any) -> str | None:
        """Why `value` (an int or float) is not in this range, or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"not a number; give {self.describe()}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"not a finite number; give {self.describe()}"
        if self.whole and not isinstance(value, int):
            return f"not a whole number; give {self.describe()}"
        too_low = self.low is not None and (value < self.low or (self.low_open and value == self.low))
        too_high = self.high is not None and value > self.high
        if too_low or too_high:
            return f"out of range; give {self.describe()}"
        return None

    def check(self, value: Any) -> int | float:
        """`value` when it is in range (an int, or a float for a non-whole range), else
        ValueError with the reason."""
        why = self.problem(value)
        if why is not None:
            raise ValueError(why)
        return value if self.whole else float(value)

    def parse(self, text: Any) -> int | float:
        """A number from text (a flag's value), checked; ValueError with the reason."""
        if isinstance(text, (int, float)) and not isinstance(text, bool):
            return self.check(text)
        raw = str(text).strip()
        try:
            number: int | float = int(raw, 10) if self.whole else float(raw)
        except ValueError:
            if self.whole and _is_float(raw):
                raise ValueError(f"not a whole number; give {self.describe()}") from None
            raise ValueError(f"not a number; give {self.describe()}") from None
        return self.check(number)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _show(bound: float | None) -> str:
    if bound is None:
        return ""
    if float(bound).is_integer():
        return str(int(bound)) if abs(bound) < 10**12 else f"2**{int(bound).bit_length()}-1"
    return f"{bound:g}"


MAX_SEED = 2**63 - 1      # the history's seed column is a BIGINT
MAX_NESTING = 200         # levels of nesting in a suite document or a JSON value a user hands in
MAX_OPTIONS_BYTES = 1 << 20          # a preset's options, as JSON (they sit in every run's meta line)
MAX_OPTIONS_FILE_BYTES = 16 << 20    # an options file, read at most this far (a suite file's bound)
MAX_HISTORY_LINE_BYTES = 64 << 20    # one line of a run file: what the history's reader parses at most

JOBS = Range(1, 1024, whole=True)
THREADS = Range(1, 1024, whole=True)
TIMEOUT_S = Range(0.1, 7 * 24 * 3600, unit="seconds")
REPEATS = Range(1, 10_000, whole=True)
BATCH = Range(1, 1024, whole=True)
CALIBRATION_SAMPLES = Range(1, 1024, whole=True)
WARMUP = Range(0, 10_000, whole=True)
SEED_COUNT = Range(1, 10_000, whole=True)
SEED = Range(0, MAX_SEED, whole=True)
NON_NEGATIVE = Range(0.0)                  # tolerances, thresholds (0: off)
POSITIVE = Range(0.0, low_open=True)       # factors, steps
ENTRIES = Range(1, 2**31 - 1, whole=True)
SHARDS = Range(1, 1024, whole=True)        # N of --shard K/N
THREADS = Range(0, 1024, whole=True)       # a runtime's thread count (0: its default)
OPTION_INT = Range(-(2**31), 2**31 - 1, whole=True)   # a whole-number preset option, as C APIs take it


class FlagError(click.BadParameter):
    """A flag whose value is refused: shown like every other input error, as one line
    `opdiff: error: --FLAG 'VALUE': why`, exit 2."""

    def __init__(self, message: str, value: Any, ctx: click.Context | None, param: click.Parameter | None):
        super().__init__(message, ctx=ctx, param=param)
        self.value = value

    def format_message(self) -> str:
        names = getattr(self.param, "opts", None) or [getattr(self.param, "name", None) or "a flag"]
        return printable(f"{'/'.join(names)} {str(self.value)!r}: {self.message.rstrip('.')}.")

    def show(self, file: Any = None) -> None:
        click.echo(f"opdiff: error: {self.format_message()}", file=file, err=file is None)


class Number(click.ParamType):
    """A numeric flag within a Range (one type for every numeric flag)."""

    def __init__(self, bounds: Range):
        self.bounds = bounds
        self.name = "integer" if bounds.whole else "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self.bounds.parse(value)
        except ValueError as exc:
            raise FlagError(str(exc), value, ctx, param) from None


def setting(where: str, value: Any, bounds: Range) -> int | float:
    """A numeric setting read from a file (`where` names the file and the key): the value,
    or an OpdiffError naming it and the range."""
    why = bounds.problem(value)
    if why is not None:
        raise OpdiffError(f"{where} must be {bounds.describe()}, not {printable(repr(value))}.")
    return value if bounds.whole else float(value)
