"""`opdiff upgrade`: what breaks if we move to torch X / executorch Y / onnxruntime Z.

    --with PKG==VER --> workerenvs: this environment's pins with PKG replaced (cached)
        --> check with the workers under that environment     (run B)
        --> check here, unless a fresh run of the same plan exists (run A)
        --> diff_runs(A, B): environment difference, newly failing / passing, drift, latency

Both checks run the same plan on the same goldens and store; only the workers' packages
differ. "Fresh" means: a complete check of exactly the same plan (suites, selection, items
with their spec hashes, presets with options, tolerance) and settings (repeats, warmup), run
under this very interpreter with the versions installed now, after the newest golden was
written.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ContextManager, Protocol, Sequence

from ..analytics import Limits, connect
from ..analytics.interleaved import check_min_ratio
from ..analytics.reports import RunDiff, diff_runs
from ..backends.registry import get_preset
from ..compare.results import Listener, RunReport
from ..core.config import Settings
from ..core.environment import DISTRIBUTIONS, versions
from ..core.errors import OpdiffError
from ..execution.workerenvs import WorkerEnv, ensure_environment, parse_with, requirements_for
from ..goldens import GoldenStore
from ..history import runs as history
from ..storage import local_folder
from .check import check
from .requests import CheckRequest, Running, UpgradeRequest
from .rounds import RoundsComparison, compare_pairs, interleaved_checks


class UpgradeUI(Protocol):
    """What upgrade tells its caller as it goes (the CLI shows it)."""

    def installing(self, line: str) -> None:
        """A line of the environment build (installer progress)."""

    def check(self, label: str) -> ContextManager[Listener | None]:
        """The listener for one of the two checks."""

    def reused(self, run_id: str) -> None:
        """The current environment's check was not run again: this fresh run was taken."""


class SilentUI:
    """The API's default: nothing is shown."""

    def installing(self, line: str) -> None:
        pass

    def check(self, label: str) -> ContextManager[Listener | None]:
        return contextlib.nullcontext(None)

    def reused(self, run_id: str) -> None:
        pass


@dataclass
class UpgradeReport:
    env: WorkerEnv
    changed: list[tuple[str, str | None, str | None]]   # (package, here, there)
    before_run: str                 # run A: this environment
    before_reused: bool             # A was a fresh run already in the store
    before: RunReport | None        # None when reused
    after: RunReport                # run B: the upgraded environment
    diff: RunDiff
    rounds: RoundsComparison | None = None   # with rounds > 1: every round's runs and the latency intervals


def upgrade(req: UpgradeRequest, *, settings: Settings = Settings(), argv: Sequence[str] = (),
            ui: UpgradeUI | None = None) -> UpgradeReport:
    """Check the goldens in the upgraded environment and here, and diff the two runs (A:
    here, B: there)."""
    withs, backends, rounds, min_ratio = req.withs, req.backends, req.rounds, req.min_ratio
    drift_factor, preset_options = req.drift_factor, req.preset_options
    ui = ui or SilentUI()
    named = parse_with(withs)
    check_min_ratio(min_ratio)
    if rounds < 1:
        raise OpdiffError(f"--rounds must be at least 1; got {rounds}.")
    if not backends:
        raise OpdiffError("upgrade needs at least one -b PRESET to check in both environments.")
    options = preset_options or {}
    presets = [get_preset(name, options.get(name)) for name in backends]   # bad names fail before the build
    if not GoldenStore(settings.goldens).exists():
        raise OpdiffError(f"no golden store at {settings.goldens}. Run `opdiff record --baseline torch_cpu_fp32` "
                          "first, or point --goldens at an existing store; nothing was built or run.")
    history.check_store_dir(settings.store)
    cache = local_folder(settings.cache, "--cache", "upgrade builds its environments in the local artifact "
                         "cache (--cache .opdiff-cache, say)")
    env = ensure_environment(requirements_for(named, [p.family for p in presets]), cache,
                             ui.installing, named)
    def request(python: Path | None) -> CheckRequest:
        return CheckRequest(list(backends), req.selection, Running(python=python), preset_options=options)

    if rounds > 1:
        pairs = interleaved_checks(request, None, env.python, rounds, settings=settings, argv=argv, ui=ui,
                                   labels=("check here", f"check under {env.python}"))
        compared = compare_pairs(pairs, settings, min_ratio, drift_factor)
        first_a, first_b = pairs[0]
        report = UpgradeReport(env, changed_packages(settings.store, first_a.run_id, first_b.run_id, env),
                               first_a.run_id, False, first_a, first_b, compared.diff, compared.comparison)
        _label(report)
        return report
    with ui.check(f"check under {env.python}") as listener:
        after = check(request(env.python), settings=settings, argv=list(argv), listener=listener)
    before_run = None if req.rerun_current else fresh_run_here(settings, after.run_id)
    before = None
    if before_run is not None:
        ui.reused(before_run)
    else:
        with ui.check("check here") as listener:
            before = check(request(None), settings=settings, argv=list(argv), listener=listener)
        before_run = before.run_id
    with connect(settings.store, limits=Limits.of(settings)) as past:
        diff = diff_runs(past, before_run, after.run_id, drift_factor=drift_factor,
                         latency_threshold=req.latency_threshold)
    report = UpgradeReport(env, changed_packages(settings.store, before_run, after.run_id, env), before_run,
                           before is None, before, after, diff)
    _label(report)
    return report


def _label(report: UpgradeReport) -> None:
    changed, diff = report.changed, report.diff
    text = ", ".join(f"{name} {here}" for name, here, _ in changed) or "this environment"
    diff.label_a = f"{text} (here, {report.before_run})"
    diff.label_b = (", ".join(f"{name} {there}" for name, _, there in changed) or "the upgrade environment") \
        + f" ({report.after.run_id})"
    if report.rounds is not None:
        n = len(report.rounds.pairs)
        diff.label_b += f"; latency over {n} interleaved rounds"


def changed_packages(store: Path | str, run_a: str, run_b: str, env: WorkerEnv) -> list[tuple[str, Any, Any]]:
    """(package, version in A, version in B): the named packages and every library whose
    version the two runs' environments record differently."""
    metas = {r.run_id: r.meta for r in history.list_runs(store) if r.run_id in (run_a, run_b)}
    ea, eb = metas.get(run_a, {}).get("env") or {}, metas.get(run_b, {}).get("env") or {}
    here = versions_here() if env.versions else {}
    out = {}
    for name, version in env.versions.items():   # named, possibly outside what environment() reports
        key = name.replace("-", "_").lower()
        out[key] = (name, ea.get(key, here.get(key)), eb.get(key, version))
    reported = {"python", *DISTRIBUTIONS}
    for key in sorted(set(ea) & set(eb)):   # a library installed in only one of them is no change
        if key in reported and ea[key] and eb[key] and ea[key] != eb[key] and key not in out:
            out[key] = (key, ea[key], eb[key])
    return list(out.values())


def versions_here() -> dict[str, Any]:
    from importlib import metadata

    out: dict[str, Any] = dict(versions())
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").replace("-", "_").lower()
        out.setdefault(name, dist.version)
    return out


def fresh_run_here(settings: Settings, planned_like: str) -> str | None:
    """The latest complete check run that planned what run `planned_like` planned, ran here
    (this interpreter, these versions, workers on this machine) with the same repeats and warmup, after the newest
    golden was written; None when there is none."""
    runs = history.list_runs(settings.store)
    target = next((r.meta for r in runs if r.run_id == planned_like), None)
    if not target or not isinstance(target.get("plan"), dict):
        return None
    plan = {k: v for k, v in target["plan"].items() if k != "python"}
    timing = {k: (target.get("settings") or {}).get(k) for k in ("repeats", "warmup")}
    now = versions()
    newest = max((info.created for info in GoldenStore(settings.goldens).index() if info.created), default="")
    for r in reversed(runs):
        meta = r.meta
        env = meta.get("env") or {}
        if (r.run_id == planned_like or not r.complete or meta.get("command") != "check"
                or not isinstance(meta.get("plan"), dict) or "python" in meta["plan"]):
            continue
        if (meta["plan"] == plan and env.get("executable") == sys.executable
                and (meta.get("settings") or {}).get("executor") in (None, "local")   # not a Ray run's nodes
                and all(env.get(k) == v for k, v in now.items())
                and {k: (meta.get("settings") or {}).get(k) for k in timing} == timing
                and str(meta.get("started") or "") > newest):
            return r.run_id
    return None
