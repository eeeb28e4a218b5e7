"""Suites and presets: list-presets, list-tests, validate."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from .app import TIMEOUT_S, echo, executor_option, guarded, patterns, python_option, settings_of


@click.command("list-presets")
@guarded
def list_presets() -> None:
    """Every preset, and whether it can export and run on this machine."""
    from .. import api
    from .output import presets_table

    Console().print(presets_table(api.presets()))


@click.command("list-tests")
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--test-ids", multiple=True, help="'a*;b': exact ids or prefixes ending in *; repeatable.")
@click.option("--tags", multiple=True, help="Only tests with this tag; repeatable.")
@click.option("--long", "long_", is_flag=True, help="Also show type, seeds, tags and spec hash.")
@click.pass_context
@guarded
def list_tests(ctx, suites, test_ids, tags, long_) -> None:
    """Expanded test ids of SUITES (default: every suite under ./suites), in order."""
    from .. import api

    for case in api.list_tests([Path(s) for s in suites] or None, test_ids=patterns(test_ids),
                               tags=patterns(tags), settings=settings_of(ctx)):
        if long_:
            echo(f"{case.id}\t{case.test_type}\tseeds={list(case.seeds)}\t"
                 f"tags={','.join(case.tags)}\t{case.spec_hash[:12]}")
        else:
            echo(case.id)


@click.command()
@click.argument("suites", nargs=-1, type=click.Path(path_type=Path))
@click.option("--imports", is_flag=True,
              help="Also import every user path (file: modules, packages) in a worker process.")
@click.option("--timeout-s", type=TIMEOUT_S, help="Per-import timeout in seconds.")
@python_option
@executor_option
@click.pass_context
@guarded
def validate(ctx, suites, imports, timeout_s, python) -> None:
    """Load and validate SUITES; report every problem at once (exit 2 if any).

    Paths are found without running the suite's code; what cannot be settled that way
    (and, with --imports, every user path) is imported in a worker process."""
    from .. import api

    cases = api.validate([Path(s) for s in suites] or None, imports=imports,
                         settings=settings_of(ctx, timeout_s=timeout_s), python=python)
    echo(f"ok: {len(cases)} tests")
