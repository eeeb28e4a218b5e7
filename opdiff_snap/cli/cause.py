"""Why a test fails: localize, repro, gradcheck."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..core import limits
from ..core.limits import Number
from ..suite.model import Tolerance
from .app import (
    JOBS,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    TIMEOUT_S,
    _echo,
    _executor_option,
    _output_file,
    _patterns,
    _python_option,
    _settings,
    _writing,
    guarded,
)

ENTRIES = Number(limits.ENTRIES)


@click.command()
@click.argument("test_id")
@click.option("-b", "--backend", required=True, help="Target preset.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--ops", is_flag=True,
              help="Descend to ATen nodes even when a leaf submodule diverges (they are searched anyway "
                   "when none does).")
@click.option("--preset-options", help="JSON (string or file) overriding the preset's options.")
@click.option("--atol", type=NON_NEGATIVE, help="Override the absolute tolerance, as for check.")
@click.option("--rtol", type=NON_NEGATIVE, help="Override the relative tolerance, as for check.")
@click.option("--baseline-factor", type=NON_NEGATIVE,
              help="Override how many times the baseline's own rounding error is allowed (0: none), as for check.")
@click.option("-j", "--jobs", type=JOBS, help="Parallel workers (default: cores).")
@click.option("--timeout-s", type=TIMEOUT_S, help="Per-job timeout in seconds (>= 0.1).")
@click.option("--in-process", is_flag=True, help="Run the jobs in this process (debugging; no isolation).")
@click.option("--trust-goldens", is_flag=True,
              help="Let goldens alone name code beyond pure ATen ops and torch.nn classes (file: modules, "
                   "user packages, ops with effects); they run in workers, and the run says which.")
@_python_option
@_executor_option
@click.pass_context
@guarded
def localize(ctx, test_id, backend, seed, ops, preset_options, atol, rtol, baseline_factor, jobs, timeout_s,
             in_process, trust_goldens, python) -> None:
    """Where a module test first diverges on BACKEND: submodule, then ATen node.

    Every leaf submodule runs alone on the target with the baseline's captured inputs.
    When none diverges (or with --ops), the smallest divergent scope is exported to ATen
    and each node runs alone the same way; where only a chain of nodes diverges, the
    shortest such range is bisected out. Each piece runs in an isolated worker (a crash is
    a CRASH at that piece). Exit 1 when something diverges."""
    from .. import api
    from ..cause.localize import format_report

    given = (atol, rtol, baseline_factor)
    report = api.localize(test_id, backend, seed=seed, preset_options=preset_options, ops=ops,
                          tolerance=Tolerance(*given) if any(v is not None for v in given) else None,
                          goldens=_settings(ctx).goldens, settings=_settings(ctx, jobs=jobs, timeout_s=timeout_s),
                          in_process=in_process, trust_goldens=trust_goldens, python=python)
    _echo(format_report(report))
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
@click.option("--trust-goldens", is_flag=True,
              help="Let goldens alone name code beyond pure ATen ops and torch.nn classes (file: modules, "
                   "user packages, ops with effects); they run in workers, and the run says which.")
@click.pass_context
@guarded
def repro(ctx, test_id, backend, seed, output, node, scope, preset_options, trust_goldens) -> None:
    """Write a standalone script (torch + the backend's runtime only) that reproduces a result."""
    import re

    from .. import api

    suffix = f"_node{node.strip()}" if node else ""
    out = output or Path(f"repro_{re.sub(r'[^A-Za-z0-9_]+', '_', test_id)[:80]}_{backend}{suffix}.py")
    _output_file(out, "-o/--output")
    with _writing(out, "-o/--output"):
        path = api.repro(test_id, backend, out, seed=seed, preset_options=preset_options,
                         goldens=_settings(ctx).goldens, trust_goldens=trust_goldens, node=node, scope=scope,
                         timeout_s=_settings(ctx).timeout_s, suites=_settings(ctx).suites)
    _echo(f"wrote {path}; run: python {path}")


@click.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--test-ids", multiple=True, help="Check these tests even without `grad: true`.")
@click.option("--tags", multiple=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--eps", type=POSITIVE, default=1e-6, show_default=True, help="Finite-difference step.")
@click.option("--max-entries", type=ENTRIES, default=32, show_default=True,
              help="Entries perturbed per tensor (a seeded sample beyond this).")
@click.option("-j", "--jobs", type=JOBS, help="Parallel workers (default: cores).")
@click.option("--timeout-s", type=TIMEOUT_S, help="Per-test timeout in seconds (>= 0.1).")
@_python_option
@_executor_option
@click.pass_context
@guarded
def gradcheck(ctx, suites, test_ids, tags, seed, eps, max_entries, jobs, timeout_s, python) -> None:
    """Autograd against central finite differences in float64 on the baseline; exit 1 on a mismatch."""
    from .. import api

    reports = api.gradcheck(list(suites) or None, test_ids=_patterns(test_ids), tags=_patterns(tags),
                            seed=seed, eps=eps, max_entries=max_entries,
                            settings=_settings(ctx, jobs=jobs, timeout_s=timeout_s), python=python)
    for rep in reports:
        _echo(rep.format())
    failed = [r.test_id for r in reports if not r.passed]
    _echo(f"{len(reports) - len(failed)} of {len(reports)} tests pass gradcheck"
          + (f"; failing: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)
