"""Why a test fails: localize, repro, gradcheck."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..core import limits
from ..core.limits import Number
from .app import (
    FORMAT_OPTION,
    POSITIVE,
    SEED,
    echo,
    executor_option,
    guarded,
    output_file,
    patterns,
    print_table,
    python_option,
    settings_of,
    writing,
)
from .option_groups import TOLERANCE, TRUST_GOLDENS, running, uses, workers

ENTRIES = Number(limits.ENTRIES)


@click.command()
@click.argument("test_id")
@click.option("-b", "--backend", required=True, help="Target preset.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--ops", is_flag=True,
              help="Descend to ATen nodes even when a leaf submodule diverges (they are searched anyway "
                   "when none does).")
@click.option("--preset-options", help="JSON (string or file) overriding the preset's options.")
@TRUST_GOLDENS
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@executor_option
@click.pass_context
@guarded
@uses(TOLERANCE, workers("jobs", "timeout_s"), running(cache=False))
def localize(ctx, test_id, backend, seed, ops, preset_options, trust_goldens, fmt, tolerance, settings,
             running) -> None:
    """Where a module test first diverges on BACKEND: submodule, then ATen node.

    Every leaf submodule runs alone on the target with the baseline's captured inputs.
    When none diverges (or with --ops), the smallest divergent scope is exported to ATen
    and each node runs alone the same way; where only a chain of nodes diverges, the
    shortest such range is bisected out. Each piece runs in an isolated worker (a crash is
    a CRASH at that piece). Exit 1 when something diverges."""
    from .. import api
    from ..cause.localize_report import format_report
    from ..core.trees import json_safe

    report = api.localize(test_id, backend, seed=seed, preset_options=preset_options, ops=ops, tolerance=tolerance,
                          goldens=settings.goldens, settings=settings, in_process=running.in_process,
                          trust_goldens=trust_goldens, python=running.python)
    if fmt == "json":
        import json

        click.echo(json.dumps(json_safe(report.to_json()), indent=1))
    else:
        echo(format_report(report))
    sys.exit(1 if report.found else 0)


@click.command()
@click.argument("test_id")
@click.option("-b", "--backend", required=True, help="Target preset.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Script path (default repro_<test>_<preset>.py).")
@click.option("--node", help="ATen node N, or nodes N-M, of the scope (as `opdiff localize` names them): "
                             "reproduce that op alone, on the intermediate values the baseline computes for it.")
@click.option("--scope", default="", help="With --node: the submodule whose ATen graph holds the node "
                                          "('name' or 'name#K' for its K-th call; default: the module itself).")
@click.option("--preset-options", help="JSON (string or file) overriding the preset's options.")
@TRUST_GOLDENS
@click.pass_context
@guarded
def repro(ctx, test_id, backend, seed, output, node, scope, preset_options, trust_goldens) -> None:
    """Write a standalone script (torch + the backend's runtime only) that reproduces a result."""
    import re

    from .. import api

    suffix = f"_node{node.strip()}" if node else ""
    out = output or Path(f"repro_{re.sub(r'[^A-Za-z0-9_]+', '_', test_id)[:80]}_{backend}{suffix}.py")
    output_file(out, "-o/--output")
    with writing(out, "-o/--output"):
        path = api.repro(test_id, backend, out, seed=seed, preset_options=preset_options,
                         goldens=settings_of(ctx).goldens, trust_goldens=trust_goldens, node=node, scope=scope,
                         timeout_s=settings_of(ctx).timeout_s, suites=settings_of(ctx).suites)
    echo(f"wrote {path}; run: python {path}")


@click.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--test-ids", multiple=True, help="Check these tests even without `grad: true`.")
@click.option("--tags", multiple=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--eps", type=POSITIVE, default=1e-6, show_default=True, help="Finite-difference step.")
@click.option("--max-entries", type=ENTRIES, default=32, show_default=True,
              help="Entries perturbed per tensor (a seeded sample beyond this).")
@python_option
@executor_option
@click.pass_context
@guarded
@uses(workers("jobs", "timeout_s"))
def gradcheck(ctx, suites, test_ids, tags, seed, eps, max_entries, python, settings) -> None:
    """Autograd against central finite differences in float64 on the baseline; exit 1 on a mismatch."""
    from .. import api

    reports = api.gradcheck(list(suites) or None, test_ids=patterns(test_ids), tags=patterns(tags),
                            seed=seed, eps=eps, max_entries=max_entries,
                            settings=settings, python=python)
    for rep in reports:
        echo(rep.format())
    failed = [r.test_id for r in reports if not r.passed]
    echo(f"{len(reports) - len(failed)} of {len(reports)} tests pass gradcheck"
         + (f"; failing: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


@click.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("-b", "--backend", "backends", multiple=True,
              help="Preset to ask (repeat for several); default: every preset that can export here.")
@click.option("--test-ids", multiple=True, help="Only these tests (opdiff selection syntax).")
@click.option("--tags", multiple=True)
@click.option("--seed", type=SEED, default=0, show_default=True, help="The seed whose inputs give the ops' shapes.")
@click.option("--tests", "per_test", is_flag=True, help="One row per (test, op) instead of one per op.")
@click.option("--changes", is_flag=True,
              help="Instead: the op calls whose support changed between the versions the op-support cache "
                   "has answers for (after an upgrade).")
@click.option("--coverage", is_flag=True,
              help="Instead: of torch's Core ATen op set, how many ops the tests exercise (exported and "
                   "decomposed as backends receive them), and per preset how many of those the latest "
                   "checks in the history ran and passed; the ops no test covers, listed.")
@FORMAT_OPTION
@python_option
@executor_option
@click.pass_context
@guarded
@uses(workers("jobs", "timeout_s"))
def ops(ctx, suites, backends, test_ids, tags, seed, per_test, changes, coverage, fmt, python, settings) -> None:
    """Which presets lower each ATen op of the suites' tests.

    Each test is exported to ATen once; its ops are answered from the op-support cache in
    the artifact cache (--cache), else by lowering the whole graph (when it lowers, all its
    ops do), else by lowering each op alone. A cell is yes, no, or k/n (k of the op's n
    distinct input signatures lower); '-' where the preset was not asked. Exit 1 when some
    preset cannot lower some op."""
    from .. import api
    from ..analytics import Table
    from ..backends.registry import all_presets, availability
    from ..cause.ops import support_changes
    from ..execution.op_support import OpSupportCache

    if coverage:
        _print_coverage(api.coverage(list(suites) or None, presets=list(backends), test_ids=patterns(test_ids),
                                     tags=patterns(tags), seed=seed, settings=settings, python=python,
                                     warn=lambda w: echo(f"warning: {w}", err=True)), fmt)
        return
    if changes:
        found = support_changes(OpSupportCache(settings.cache), backends)
        rows: list[tuple] = [(c.preset, c.op, c.signature, "yes" if c.lowered_before else "no",
                              "yes" if c.lowers_now else "no",
                              ", ".join(f"{k} {c.before[k]} -> {v}" for k, v in c.after.items())) for c in found]
        print_table(Table(["preset", "op", "signature", "lowered before", "lowers now", "versions"], rows), fmt)
        if fmt in ("table", "markdown") and not rows:
            echo("no op call changed support between the versions in the op-support cache "
                 f"({settings.cache}).")
        return
    names = list(backends) or [p.name for p in all_presets() if availability(p).can_export]
    table, surveyed = api.ops(list(suites) or None, backends=names, test_ids=patterns(test_ids),
                              tags=patterns(tags), seed=seed, settings=settings, python=python)
    if per_test:
        rows = [(t.test_id, u.op, u.signature, u.count, *[_cell(u.lowers.get(p)) for p in names], u.source)
                for t in surveyed for u in t.uses]
        print_table(Table(["test", "op", "signature", "nodes", *names, "source"], rows), fmt)
    else:
        rows = [(r.op, len(r.tests), r.nodes, *[r.support[p] for p in names], ", ".join(r.tests[:3])
                 + (f" (+{len(r.tests) - 3})" if len(r.tests) > 3 else ""), r.source) for r in table]
        print_table(Table(["op", "tests", "nodes", *names, "in", "first source"], rows), fmt)
    failed = [t for t in surveyed if t.error]
    asked = sum(t.asked for t in surveyed)
    if fmt in ("table", "markdown"):
        echo(f"{len(table)} ops in {len(surveyed) - len(failed)} tests; {asked} op calls lowered alone now, "
             "the rest answered by the op-support cache or by their whole graph lowering.")
        for t in failed[:10]:
            echo(f"  {t.test_id}: no ATen graph ({t.error})", err=True)
    blocked = any(cell == "no" or "/" in cell for r in table for cell in r.support.values())
    sys.exit(1 if blocked or failed else 0)


def _cell(answer: bool | None) -> str:
    return "-" if answer is None else "yes" if answer else "no"


def _print_coverage(found, fmt: str) -> None:
    import dataclasses
    import json

    from ..analytics import Table

    n, k = len(found.core), len(found.exercised)
    if fmt == "json":
        echo(json.dumps({"core": n, "exercised": {op: tests for op, tests in found.exercised.items()},
                         "not_covered": found.not_covered, "outside_core": found.other,
                         "presets": [dataclasses.asdict(p) for p in found.presets],
                         "no_graph": {t.test_id: t.error for t in found.failed}}, indent=2))
        return
    rows = [(p.preset, f"{p.lowered} of {k}", f"{p.passed} of {k}", p.converted_only, p.not_checked)
            for p in found.presets]
    if fmt in ("table", "markdown"):
        echo(f"{k} of {n} Core ATen ops exercised by the selected tests ({len(found.other)} more ops outside "
             "the core set remain in their graphs after decomposition)")
    print_table(Table(["preset", "lowered", "passed", "converted only (cannot run here)", "not checked"], rows), fmt,
                "Per preset, in the latest check in the history:")
    if fmt == "csv":
        return
    echo(f"\nNot covered ({len(found.not_covered)}): " + ", ".join(op.removeprefix("aten::")
                                                               for op in found.not_covered))
    if found.failed:
        echo(f"{len(found.failed)} tests have no graph to read:", err=True)
        from ..core.errors import headline

        for t in found.failed[:10]:
            echo(f"  {t.test_id}: {headline(t.error or '', 160)}", err=True)
