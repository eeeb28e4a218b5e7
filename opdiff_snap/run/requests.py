"""What a command asks of a run, as typed values: which tests (`Selection`), how their
jobs run (`Running`), and one request per command that runs jobs (`RecordRequest`,
`CheckRequest`, `UpgradeRequest`). Torch-free: the API and the command line build them
before any stage is imported."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..expectations.entries import Expectations
from ..suite.model import Tolerance


@dataclass(frozen=True)
class Selection:
    """Which suites, tests and seeds a run covers (None: the configured default)."""

    suites: Sequence[Path] | None = None
    test_ids: Sequence[str] | None = None
    tags: Sequence[str] | None = None
    seeds: int | None = None
    seed_list: Sequence[int] | None = None

    @property
    def narrowed(self) -> bool:
        """Whether --test-ids or --tags narrow the run (a selection that then matches
        nothing is the user's mistake, not an empty run)."""
        return bool(self.test_ids or self.tags)


@dataclass(frozen=True)
class Running:
    """How a run's jobs run: worker processes here (under this interpreter or `python`),
    this process (`in_process`), or the configured executor; with the artifact cache
    or without."""

    in_process: bool = False
    python: Path | None = None
    use_cache: bool = True


@dataclass(frozen=True)
class RecordRequest:
    """What one record run records: the selection, on `baseline` (with its options);
    `force` records goldens that are current too; `skips` are (test id or prefix*, preset
    or glob) pairs reported SKIPPED. `reference=False` leaves out the float64 reference
    (such goldens keep the configured tolerances only; bench/bench_reference.py uses it
    to measure what the reference costs)."""

    selection: Selection = Selection()
    running: Running = Running()
    baseline: str = "torch_cpu_fp32"
    preset_options: str | dict | None = None
    force: bool = False
    skips: Sequence[tuple[str, str]] = ()
    reference: bool = True


@dataclass(frozen=True)
class CheckRequest:
    """What one check runs: the target presets (with `preset_options` per preset name),
    the selection, `skips` ((test id or prefix*, preset or glob) pairs reported SKIPPED),
    a tolerance override, a run to `resume`, and `shard=(K, N)`: the K-th of N shards of
    the planned (test, seed, preset) jobs (history/sharding.py), whose `run_group` names the
    logical run the N shards make up."""

    backends: Sequence[str]
    selection: Selection = Selection()
    running: Running = Running()
    preset_options: Mapping[str, str | dict] | None = None
    skips: Sequence[tuple[str, str]] = ()
    tolerance: Tolerance | None = None
    resume: str | None = None
    trust_goldens: bool = False
    shard: tuple[int, int] | None = None
    run_group: str | None = None
    require_delegated: bool = False   # any op node left off a delegate fails the result (NOT_DELEGATED)
    expectations: Expectations | None = None   # each result carries the verdict expected of it
    outputs_from: Path | None = None   # a replay bundle's folder: judge the outputs a device returned there

    def refusal(self) -> str | None:
        """Why these options cannot make a check, before anything is read."""
        if self.shard is not None and not self.run_group:
            return (f"--shard {self.shard[0]}/{self.shard[1]} needs --run-group ID, the same for all "
                    f"{self.shard[1]} shards (a CI run id, say): the shards agree on their split through "
                    "it, and `opdiff runs` and the reports take them as one run.")
        if self.outputs_from is not None and (self.shard is not None or self.resume):
            return ("--outputs-from judges the outputs a device returned in one run; it takes no --shard "
                    "or --resume.")
        if not self.backends:
            return "check needs at least one --backend PRESET (see `opdiff list-presets`)."
        if self.tolerance is not None:
            for name in ("atol", "rtol", "baseline_factor", "precision_factor"):
                value = getattr(self.tolerance, name)
                if value is not None and not (math.isfinite(value) and value >= 0):
                    return f"--{name.replace('_', '-')} {value}: it must be a finite number >= 0."
        if len(set(self.backends)) != len(self.backends):
            return f"--backend names a preset twice ({', '.join(self.backends)}); give each once."
        unknown = [name for name in self.preset_options or {} if name not in self.backends]
        if unknown:
            return (f"--preset-options names '{unknown[0]}', which is not a --backend of this "
                    f"check ({', '.join(self.backends)}).")
        return None


@dataclass(frozen=True)
class BundleRequest:
    """What one bundle writes: the selection on the target presets (with `preset_options`
    per preset name), into the new folder `out`; `skips` as check's."""

    backends: Sequence[str]
    out: Path
    selection: Selection = Selection()
    running: Running = Running()
    preset_options: Mapping[str, str | dict] | None = None
    skips: Sequence[tuple[str, str]] = ()


@dataclass(frozen=True)
class UpgradeRequest:
    """What one upgrade compares: the goldens checked on `backends` (with `preset_options`
    per preset name) here and in an environment with `withs` (NAME==VERSION) replaced.
    With `rounds` > 1 the checks alternate (here, there, here, there, ...) and a latency
    change is one whose 95 % interval over the rounds clears `min_ratio` (run/rounds.py);
    with 1, one check each and diff-runs' `latency_threshold`. `rerun_current` checks here
    again even when a fresh run of the same plan exists."""

    withs: Sequence[str]
    backends: Sequence[str]
    selection: Selection = Selection()
    preset_options: dict[str, Any] | None = None
    rerun_current: bool = False
    drift_factor: float = 10.0
    latency_threshold: float = 0.25
    rounds: int = 3
    min_ratio: float = 1.1
