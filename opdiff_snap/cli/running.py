"""The commands that run jobs and write the history: record and check."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..core.errors import OpdiffError
from .app import executor_option, guarded
from .opdiff_flags import OPDIFF_FLAGS, OpdiffFlags
from .option_groups import (
    CHECK_REPORTING,
    EXPECTATIONS,
    PLACEMENT,
    RECORD_REPORTING,
    SELECTION,
    TARGETS,
    TOLERANCE,
    TRUST_GOLDENS,
    ExpectationsFlags,
    Placement,
    Reporting,
    Targets,
    running,
    uses,
    workers,
)
from .run_report import run_and_report


@click.command()
@click.option("--baseline", default="torch_cpu_fp32", show_default=True, help="Preset that computes the goldens.")
@click.option("--preset-options", help="JSON (string or file) overriding the baseline preset's options.")
@click.option("--force", is_flag=True, help="Re-record goldens that are up to date too.")
@executor_option
@click.pass_context
@guarded
@uses(SELECTION, workers("jobs", "timeout_s", "repeats", "warmup"), running(python=False, cache=False),
      RECORD_REPORTING, OPDIFF_FLAGS)
def record(ctx, baseline, preset_options, force, selection, settings, running, reporting: Reporting,
           opdiff: OpdiffFlags) -> None:
    """Record goldens: run the baseline on seeded inputs and store inputs, weights and outputs.

    With no SUITES, records every suite under ./suites. Writes only missing or stale
    goldens unless --force."""
    from .. import api
    from ..run.requests import RecordRequest

    if opdiff.backends:
        names = opdiff.presets()
        if len(names) != 1:
            raise OpdiffError(f"--backends '{opdiff.backends}': record runs one baseline; give it as "
                              "--baseline PRESET, then `opdiff check -b ...` for the targets.")
        baseline = names[0]
    overrides = opdiff.overrides()
    if overrides is not None:
        if preset_options:
            raise OpdiffError("give --preset-options or opdiff's --backend-overrides-*, not both.")
        preset_options = overrides
    request = RecordRequest(opdiff.selection(selection), running, baseline=baseline, preset_options=preset_options,
                            force=force, skips=tuple(opdiff.skip_pairs()))
    run_and_report(lambda listener: api.record(request, settings=settings, argv=sys.argv[1:], listener=listener),
                   reporting, f"record {baseline}")


@click.command()
@click.option("--require-delegated", is_flag=True,
              help="An op node left off the delegate (ExecuTorch with XNNPACK, CoreML, MPS) fails the result: "
                   "NOT_DELEGATED (per preset: the option require_delegated).")
@TRUST_GOLDENS
@executor_option
@click.pass_context
@guarded
@uses(SELECTION, TARGETS, TOLERANCE, workers("jobs", "timeout_s", "repeats", "warmup", "batch"), running(),
      PLACEMENT, EXPECTATIONS, CHECK_REPORTING, OPDIFF_FLAGS)
def check(ctx, require_delegated, trust_goldens, selection, targets: Targets, tolerance, settings, running,
          placement: Placement, expecting: ExpectationsFlags, reporting: Reporting, opdiff: OpdiffFlags) -> None:
    """Check goldens on target presets: exactly the stored inputs and weights, compared
    with tolerances; one JSONL history file per run in ./store.

    Exit 0 when nothing failed, 1 when a --fail-on verdict occurred, 2 on input errors. With
    an expectations file: 1 only for a failure it does not expect (or expects otherwise),
    or an expected failure that now passes (strict_expectations)."""
    from .. import api
    from ..run.requests import CheckRequest

    backends = targets.backends + opdiff.presets()
    if not backends and placement.outputs_from is None:
        raise OpdiffError("check needs a target: -b PRESET (repeatable) or --backends 'A;B' "
                          "(see `opdiff list-presets`).")
    options = targets.preset_options
    overrides = opdiff.overrides()
    if overrides is not None:
        if options:
            raise OpdiffError("give --preset-options or opdiff's --backend-overrides-*, not both.")
        options = {name: overrides for name in backends}
    selection = opdiff.selection(selection)
    held = expecting.load(settings)
    request = CheckRequest(backends, selection, running, preset_options=options, skips=tuple(opdiff.skip_pairs()),
                           tolerance=tolerance, resume=placement.resume, trust_goldens=trust_goldens,
                           shard=placement.shard, run_group=placement.run_group,
                           require_delegated=require_delegated, outputs_from=placement.outputs_from,
                           expectations=held.expectations if held is not None else None)
    shard = placement.shard
    run_and_report(lambda listener: api.check(request, settings=settings, argv=sys.argv[1:], listener=listener),
                   reporting, "check" if not shard else f"check shard {shard[0]}/{shard[1]}", held)


@click.command()
@click.option("-o", "--out", "out", required=True, type=click.Path(path_type=Path), metavar="DIR",
              help="The new folder to write the bundle into.")
@click.pass_context
@guarded
@uses(SELECTION, TARGETS, workers("jobs", "timeout_s"), running(python=False), OPDIFF_FLAGS)
def bundle(ctx, out, selection, targets: Targets, settings, running, opdiff: OpdiffFlags) -> None:
    """Write a replay bundle: each selected test's artifact as check would run it, its
    inputs, a manifest and a runner per runtime family that needs only that runtime and
    NumPy. Run the runner where the model ships (a Mac, a phone, a board), bring the folder
    back, and judge it with `opdiff check --outputs-from DIR` (docs/bundles.md)."""
    from .. import api
    from ..run.requests import BundleRequest
    from ..run.session import RunListener
    from .output import make_console

    backends = targets.backends + opdiff.presets()
    if not backends:
        raise OpdiffError("bundle needs a target: -b PRESET (repeatable), an onnx_*, executorch_* or coreml_* "
                          "preset (see `opdiff list-presets`).")
    request = BundleRequest(backends, out, opdiff.selection(selection), running,
                            preset_options=targets.preset_options, skips=tuple(opdiff.skip_pairs()))
    console = make_console(sys.stdout)

    class Notices(RunListener):
        """A bundle's notices and warnings, printed as they come."""

        def notice(self, text: str) -> None:
            console.print(text, highlight=False, markup=False)

        def warn(self, text: str) -> None:
            console.print(f"warning: {text}", highlight=False, markup=False)

    report = api.bundle(request, settings=settings, listener=Notices())
    left = ", ".join(f"{n} {v}" for v, n in sorted(report.left_out.items())) or "none"
    console.print(f"bundle {report.path}: {report.entries} entries; left out with their verdicts: {left}",
                  highlight=False, markup=False)
    for runner in report.runners:
        console.print(f"  on the device: python {report.path / runner}", highlight=False, markup=False)
    console.print(f"  back here: opdiff check --outputs-from {report.path}", highlight=False, markup=False)

