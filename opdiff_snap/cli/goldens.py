"""`opdiff goldens`: the golden store listed, shown, pruned, verified, given references."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from ..core.verdicts import GoldenState, Verdict
from .app import JOBS, SEED, OpdiffGroup, echo, executor_option, guarded, patterns, settings_of


@click.group(cls=OpdiffGroup)
def goldens() -> None:
    """Inspect and maintain the golden store."""


@goldens.command("ls")
@click.option("--test-ids", multiple=True, help="'a*;b': exact ids or prefixes ending in *; repeatable.")
@click.pass_context
@guarded
def goldens_ls(ctx, test_ids) -> None:
    """Every golden: test, seeds, baseline, recorded with which versions, stale or not."""
    from .. import api
    from .output import goldens_table

    settings = settings_of(ctx)
    rows = api.goldens(settings, patterns(test_ids))
    Console().print(goldens_table(rows))
    echo(f"{sum(len(r.infos) for r in rows)} goldens of {len(rows)} tests in {settings.goldens}")


@goldens.command("show")
@click.argument("test_id")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.pass_context
@guarded
def goldens_show(ctx, test_id, seed) -> None:
    """Inputs, parameters and outputs of one golden (shapes, dtypes, value summaries) and its metadata."""
    from .. import api
    from .output import describe_golden

    describe_golden(Console(), api.golden(test_id, seed, settings_of(ctx)))


@goldens.command("prune")
@click.option("--yes", is_flag=True, help="Really delete; without it, only list what would go.")
@click.pass_context
@guarded
def goldens_prune(ctx, yes) -> None:
    """Remove goldens whose tests no longer exist in the suites (dry run unless --yes)."""
    from .. import api

    orphans = api.prune(settings_of(ctx), delete=yes)
    for info in orphans:
        echo(f"{'deleted' if yes else 'would delete'} {info.test_id} seed={info.seed}")
    echo(f"{len(orphans)} orphaned goldens{'' if yes else ' (dry run; --yes deletes them)'}")


@goldens.command("reference")
@click.option("--test-ids", multiple=True, help="'a*;b': exact ids or prefixes ending in *; repeatable.")
@click.option("--force", is_flag=True, help="Measure goldens that already have a reference again.")
@click.option("-j", "--jobs", type=JOBS, help="Parallel workers (default: cores).")
@click.option("--in-process", is_flag=True, help="Run in this process (debugging; no isolation).")
@click.option("--trust-goldens", is_flag=True,
              help="Let goldens alone name code beyond pure ATen ops and torch.nn classes (file: modules, "
                   "user packages, ops with effects); they run in workers, and the run says which.")
@executor_option
@click.pass_context
@guarded
def goldens_reference(ctx, test_ids, force, jobs, in_process, trust_goldens) -> None:
    """Add a float64 reference to goldens recorded without one, keeping their outputs.

    Each golden runs in float64 on its stored inputs and weights; the difference to its
    stored outputs is the baseline's own rounding error, which check then allows for."""
    from .. import api

    results = api.add_references(None, test_ids=patterns(test_ids), force=force, in_process=in_process,
                                 trust_goldens=trust_goldens, settings=settings_of(ctx, jobs=jobs))
    counts: dict[Verdict, int] = {}
    for r in results:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
        if r.verdict is Verdict.BASELINE_FAIL or (r.verdict is Verdict.RECORDED and "added" not in r.message):
            echo(f"{r.verdict.value} {r.test_id} seed={r.seed}: {r.message}")
    echo(f"{counts.get(Verdict.RECORDED, 0)} goldens measured, {counts.get(Verdict.KEPT, 0)} already had a "
         f"reference, {counts.get(Verdict.BASELINE_FAIL, 0)} could not be rebuilt")
    sys.exit(1 if counts.get(Verdict.BASELINE_FAIL) else 0)


@goldens.command("verify")
@click.pass_context
@guarded
def goldens_verify(ctx) -> None:
    """Check every golden as check reads it; exit 1 if any is corrupt or stale, 2 if there
    is no golden to check.

    Checksums, metadata, tensor records, the structures that refer to tensors, and the
    stored definition (it must rebuild into a test whose spec hash is the stored one;
    UNCHECKED when a file: module it names is not found from here)."""
    from .. import api

    findings, n = api.verify(settings_of(ctx))
    for f in findings:
        echo(f"{f.kind} {f.info.test_id} seed={f.info.seed}: {f.message}")
    corrupt, stale, unchecked = (len({f.info.key for f in findings if f.kind is kind})
                                 for kind in (GoldenState.CORRUPT, GoldenState.STALE, GoldenState.UNCHECKED))
    echo(f"{n} goldens checked, {corrupt} corrupt" + (f", {stale} stale" if stale else "")
         + (f", {unchecked} with a spec hash not checked from here" if unchecked else ""))
    sys.exit(1 if corrupt or stale else 0)


@goldens.command("pack")
@click.pass_context
@guarded
def goldens_pack(ctx) -> None:
    """Fold small loose goldens into packs (one compressed Zarr array per suite) and rewrite
    the packs whose goldens changed; safe to interrupt and to run again (docs/goldens-layout.md).

    New goldens are written loose, one folder each; a loose golden wins over a packed copy.
    Goldens that fail their checks, and those over 64 KiB of tensors, stay loose."""
    from .. import api

    r = api.pack_goldens(settings_of(ctx))
    for key, why in r.damaged:
        echo(f"CORRUPT {key}: left loose ({why})")
    echo(f"{r.packed} goldens in packs: {r.folded} loose goldens folded in, {len(r.written)} packs written, "
         f"{len(r.removed)} replaced packs removed; {r.large} large goldens stay loose"
         + (f", {len(r.damaged)} damaged ones too" if r.damaged else "")
         + (f", {r.kept_newer} recorded meanwhile kept loose" if r.kept_newer else "") + f" ({r.seconds:.1f} s)")
    sys.exit(1 if r.damaged else 0)
