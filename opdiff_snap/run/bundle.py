"""`opdiff bundle`: a replay bundle (core/bundle_format.py) for a device where neither torch
nor this tool runs. Planned exactly as check plans (run/check.py), each (test, seed,
preset) is exported as check would export it alone (the artifact cache reused), and the
artifact, the inputs its runtime is fed and a manifest entry are written, with the runner
scripts of the families present. What cannot be bundled (a skip, a stale golden, an
export failure) is kept in the manifest with its verdict, so the device's run reports it.

The bundle is written in a staging folder beside DIR and renamed to DIR when whole."""

from __future__ import annotations

import dataclasses
import datetime
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..backends.base import Preset
from ..backends.registry import backend_for
from ..compare.results import Listener
from ..core.bundle_format import ArraySpec, Entry, Left, Manifest, write_json
from ..core.config import Settings, apply_endpoint
from ..core.errors import OpdiffError
from ..execution.bundled_program import expected_as_fed
from ..execution.bundling import BundleTarget
from ..execution.job import Outcome
from ..execution.outputs import flat_values
from ..execution.pools import Pool, make_pool
from ..execution.runner import Job
from ..goldens import GoldenStore
from ..goldens.golden import golden_digest
from .check import golden_store, plan_check, preset_list, suite_reader
from .check_job import CheckJob, item_work
from .check_plan import CheckPlan
from .judge import Pending
from .requests import BundleRequest, CheckRequest
from .session import notice, set_total

RUNNERS = "opdiff_snap.bundle_runners"
SHARED_RUNNER_FILE = "bundle_io.py"


@dataclass(frozen=True)
class BundleReport:
    path: Path
    entries: int
    left_out: dict[str, int]      # verdict -> count
    runners: list[str]


def bundle(request: BundleRequest, *, settings: Settings = Settings(), listener: Listener | None = None
           ) -> BundleReport:
    """Write the bundle at `request.out`."""
    apply_endpoint(settings)
    out = request.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OpdiffError(f"-o {out}: it exists and is not an empty folder; give a new folder for the bundle "
                          "(nothing was written).")
    check = CheckRequest(request.backends, request.selection, request.running,
                         preset_options=request.preset_options, skips=request.skips)
    presets = preset_list(check, listener)
    _refuse_unbundled(presets)
    store = golden_store(settings, listener)
    reader = suite_reader(settings, True, listener)
    _, plan, _ = plan_check(check, store, settings, listener, reader)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        manifest = _fill(plan, presets, store, settings, request, staging, listener)
        runners = _copy_runners(staging, {backend_for(p).bundle_runner for p in presets
                                          if any(e.preset == p.name for e in manifest.entries)})
        write_json(staging / "manifest.json", manifest.to_json())
        if out.exists():
            out.rmdir()
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    counts: dict[str, int] = {}
    for left in manifest.left_out:
        counts[left.verdict] = counts.get(left.verdict, 0) + 1
    return BundleReport(out, len(manifest.entries), counts, runners)


def _refuse_unbundled(presets: list[Preset]) -> None:
    never = [p.name for p in presets if not backend_for(p).bundle_runner]
    if never:
        raise OpdiffError(f"-b {', '.join(never)}: no artifact of {'this preset' if len(never) == 1 else 'these'} "
                          "runs without torch and this tool, so there is nothing to bundle for a device; bundle "
                          "the onnx_*, executorch_* or coreml_* presets (`opdiff list-presets`).")


def _fill(plan: CheckPlan, presets: list[Preset], store: GoldenStore, settings: Settings, request: BundleRequest,
          staging: Path, listener: Listener | None) -> Manifest:
    """Every planned (test, seed, preset) as an entry or as left out, in plan order."""
    with make_pool(settings, request.running.in_process, listener, request.running.python) as pool:
        return _fill_from(pool, plan, presets, store, settings, request, staging, listener)


def _fill_from(pool: Pool, plan: CheckPlan, presets: list[Preset], store: GoldenStore, settings: Settings,
               request: BundleRequest, staging: Path, listener: Listener | None) -> Manifest:
    env = pool.environment()
    manifest = Manifest(datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                        {k: v for k, v in env.items() if k != "executable"},
                        {p.name: p.to_json() | {"name": p.name} for p in presets})
    jobs: list[Job] = []
    pendings: dict[str, tuple[str, Pending]] = {}
    for item in plan.items:
        decided, runs = item_work(item, presets, store, skips=request.skips, settings=settings, use_cache=True)
        manifest.left_out += [Left(r.test_id, r.seed, r.preset, r.verdict.value, r.message, r.error_class or "")
                              for r in decided]
        for job, pending in runs:
            entry = f"e{len(pendings) + 1}"
            half = bool(pending.preset.options.get("export_fp16"))
            expected = expected_as_fed(flat_values(pending.golden.outputs), half) \
                if backend_for(pending.preset).family == "executorch" else None
            if isinstance(job, CheckJob):   # an export failure is kept as it is: no survey of its ops
                job = dataclasses.replace(job, survey_ops=False)
            jobs.append(dataclasses.replace(job, bundle=BundleTarget(str(staging), entry, expected), alone=True,
                                            repeats=0, warmup=0, grads=None, elementwise=False, control=False))
            pendings[job.key] = (entry, pending)
    set_total(listener, len(jobs))
    notice(listener, f"bundling {len(jobs)} (test, seed, preset) jobs; {len(manifest.left_out)} decided without "
                     "exporting")
    for outcome in pool.run(jobs):
        entry_id, pending = pendings.pop(outcome.key)
        if outcome.status is None and outcome.bundled is not None:
            manifest.entries.append(_entry(entry_id, pending, outcome))
        else:
            verdict = outcome.status.value if outcome.status is not None else "EXPORT_FAIL"
            manifest.left_out.append(Left(pending.item.test_id, pending.item.seed, pending.preset.name, verdict,
                                          outcome.error_message or "", outcome.error_class or ""))
        done = len(jobs) - len(pendings)
        if done % 50 == 0 and pendings:
            notice(listener, f"bundled {done} of {len(jobs)}")
    manifest.entries.sort(key=lambda e: int(e.id[1:]))
    return manifest


def _entry(entry_id: str, pending: Pending, outcome: Outcome) -> Entry:
    golden, bundled = pending.golden, outcome.bundled
    assert bundled is not None
    outputs = tuple(ArraySpec(tuple(int(d) for d in t.shape), str(t.dtype).removeprefix("torch."))
                    for t in flat_values(golden.outputs))
    preset = pending.preset
    units = str(preset.options.get("compute_units") or "") if backend_for(preset).family == "coreml" else ""
    calibration = outcome.quantized.calibration if outcome.quantized is not None else ""
    return Entry(entry_id, golden.test_id, golden.seed, preset.name, backend_for(preset).family, bundled.artifact,
                 bundled.artifact_sha256, bundled.inputs, bundled.inputs_sha256, bundled.input_specs, outputs,
                 golden_digest(golden), units, calibration, bundled.bundled_program)


def _copy_runners(staging: Path, names: set[str]) -> list[str]:
    """The runner scripts of the families bundled, and what they share."""
    if not names:
        return []
    files = resources.files(RUNNERS)
    for name in sorted(names) + [SHARED_RUNNER_FILE]:
        (staging / name).write_text(files.joinpath(name).read_text())
    return sorted(names)
