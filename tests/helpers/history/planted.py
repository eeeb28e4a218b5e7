"""A synthetic history with planted changes and their ground truth: what the step detector
(analytics/steps.py) is measured against (bench/bench_regressions.py, tests). Written like
synth.py's runs, with chosen run ids and times.

Runs follow a sequence of environments (torch, onnxruntime, executorch versions changing
one at a time). Latency noise is modelled on what this project measured between two runs
of one environment on a 2-core machine (docs/benchmarks.md): a per-run load factor shared by
every result of the run, per-result lognormal noise that is larger for fast ops (sigma 0.2
under 0.05 ms: two runs of 10-25 us ops then differ by 0.5x to 2.3x, as measured), and
rare outliers (a result 2-4x slower). Statuses flake too: a rare single-run TIMEOUT.

At each environment change a few (test, preset) series get a planted change that lasts
from then on: a latency step (x0.4 to x0.6 or x1.7 to x3), a status change (PASS ->
EXPORT_FAIL or MISMATCH), or max_abs growing 1000x.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from opdiff_snap.compare.metrics import Metrics
from opdiff_snap.compare.results import Result
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.suite.model import Tolerance

from .synth import ENV

TRUTH = "planted.json"     # the ground truth, beside runs/
PRESETS = ("torch_cpu_fp32", "onnx_cpu_fp32", "executorch_cpu_fp32", "coreml_any_fp16")
# One library moves at each environment change, in this order (then the cycle repeats).
UPGRADES = (("torch", ("2.10.0", "2.11.0", "2.12.0", "2.13.0", "2.14.1", "2.15.0")),
            ("onnxruntime", ("1.28.0", "1.29.1", "1.30.0", "1.31.1", "1.32.0", "1.33.0")),
            ("executorch", ("1.2.0", "1.3.0", "1.4.0", "1.5.1", "1.6.0", "1.7.0")))


@dataclass(frozen=True)
class Planted:
    """One planted change: (test, seed, preset, kind) from run `run_id` on."""

    test_id: str
    seed: int
    preset: str
    kind: str            # latency, status, metric
    run_id: str
    detail: str          # "x2.1", "EXPORT_FAIL", "x1000"


@dataclass
class PlantedHistory:
    store: Path
    runs: int
    results: int
    planted: list[Planted] = field(default_factory=list)


@dataclass
class _Series:
    test_id: str
    preset: str
    base_ms: float
    status: str = Verdict.PASS.value
    max_abs: float = 2e-6


def environments(count: int) -> list[dict[str, str]]:
    """`count` environments, each differing from the one before in one library."""
    state = {lib: versions[0] for lib, versions in UPGRADES}
    out = [dict(state)]
    for i in range(1, count):
        lib, versions = UPGRADES[(i - 1) % len(UPGRADES)]
        step = (i - 1) // len(UPGRADES) + 1
        state[lib] = versions[min(step, len(versions) - 1)] if step < len(versions) else f"{versions[-1]}.post{step}"
        out.append(dict(state))
    return out


def generate(store: Path, runs: int = 60, tests: int = 50, presets: tuple[str, ...] = PRESETS,
             envs: int = 6, plant_frac: float = 0.03, seed: int = 0, repeats: int = 5) -> PlantedHistory:
    """Write `runs` check runs of `tests` x `presets` results into `store/runs/`; return
    the ground truth. Environments change every runs // envs runs."""
    rnd = random.Random(seed)
    runs_dir = Path(store) / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    series = [_Series(f"op{t:05d}", p, math.exp(rnd.uniform(math.log(0.01), math.log(5.0))))
              for t in range(tests) for p in presets]
    env_list = environments(envs)
    per_env = max(1, runs // envs)
    out = PlantedHistory(Path(store), runs, len(series))
    for r in range(runs):
        env_index = min(r // per_env, envs - 1)
        run_id = f"20260101T{r // 3600:02d}{r // 60 % 60:02d}{r % 60:02d}Z-{r:06x}"
        minute = r
        ts = f"2026-01-{1 + minute // 1440:02d}T{minute // 60 % 24:02d}:{minute % 60:02d}:00Z"
        if r > 0 and r % per_env == 0 and env_index == r // per_env:
            _plant(rnd, series, plant_frac, run_id, out.planted)
        load = math.exp(rnd.gauss(0.0, 0.08))
        lines = [_meta(run_id, ts, env_list[env_index], presets)]
        for s in series:
            lines.append(_item(rnd, s, run_id, ts, load, repeats))
        lines.append(json.dumps({"type": "end", "run_id": run_id, "finished": ts, "wall_s": 1.0, "counts": {}}))
        (runs_dir / f"{run_id}.jsonl").write_text("\n".join(lines) + "\n")
    (Path(store) / TRUTH).write_text(json.dumps([dataclasses.asdict(p) for p in out.planted], indent=0))
    return out


def read_truth(store: Path) -> list[Planted]:
    """The planted changes `generate` wrote beside the history."""
    return [Planted(**p) for p in json.loads((Path(store) / TRUTH).read_text())]


def _plant(rnd: random.Random, series: list[_Series], frac: float, run_id: str, out: list[Planted]) -> None:
    timed = [s for s in series if s.status in (Verdict.PASS.value, Verdict.MISMATCH.value)]
    for s in rnd.sample(timed, min(len(timed), max(1, round(frac * len(series))))):
        kind = rnd.choice(("latency", "latency", "status", "metric"))
        if kind == "status" and s.status != Verdict.PASS.value:
            kind = "latency"
        if kind == "latency":
            factor = rnd.uniform(1.7, 3.0) if rnd.random() < 0.6 else rnd.uniform(0.4, 0.6)
            s.base_ms *= factor
            detail = f"x{factor:.2f}"
        elif kind == "status":
            s.status = rnd.choice((Verdict.EXPORT_FAIL.value, Verdict.MISMATCH.value))
            detail = s.status
        else:
            s.max_abs *= 1000
            detail = "x1000"
        out.append(Planted(s.test_id, 0, s.preset, kind, run_id, detail))


def _meta(run_id: str, ts: str, env: dict[str, str], presets: tuple[str, ...]) -> str:
    return json.dumps({"type": "meta", "run_id": run_id, "command": "check", "argv": ["opdiff", "check"],
                       "started": ts, "host": "box", "os": "Linux", "machine": "x86_64",
                       "suites": ["suites/core.yaml"], "baseline_preset": "torch_cpu_fp32",
                       "presets": {p: {"family": p.split("_")[0]} for p in presets},
                       "env": {**ENV, **env}})


def _item(rnd: random.Random, s: _Series, run_id: str, ts: str, load: float, repeats: int) -> str:
    sigma = 0.2 if s.base_ms < 0.05 else 0.08
    ms = s.base_ms * load * math.exp(rnd.gauss(0.0, sigma))
    if rnd.random() < 0.01:
        ms *= rnd.uniform(2.0, 4.0)
    status = s.status
    if rnd.random() < 0.002:
        status = Verdict.TIMEOUT.value
    ran = status in (Verdict.PASS.value, Verdict.MISMATCH.value)
    times = [round(ms * math.exp(rnd.gauss(0.0, 0.05)), 6) for _ in range(repeats)] if ran else []
    max_abs = s.max_abs * math.exp(rnd.gauss(0.0, 0.3)) if ran else None
    metrics = None if max_abs is None else Metrics(max_abs=max_abs)
    result = Result(s.test_id, 0, s.preset, Verdict(status), "", test_type="op", suite="suites/core.yaml",
                    spec_hash="h-" + s.test_id, baseline="torch_cpu_fp32", export_ms=10.0, load_ms=1.0,
                    infer_ms=sorted(times)[len(times) // 2] if times else None, infer_ms_all=times,
                    tolerance=Tolerance(1e-5, 1.3e-6), metrics=metrics)
    return json.dumps({"type": "item", "run_id": run_id, **result.to_json(), "ts": ts})
