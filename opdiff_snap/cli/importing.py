"""`opdiff import`: suites written from other sources of tests."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .app import echo, guarded


@click.group("import")
def import_() -> None:
    """Write suites from other sources of tests."""


@import_.command("opinfo")
@click.option("--ops", multiple=True, metavar="'A;B*'",
              help="OpInfo names or globs (add, nn.functional.conv*); repeatable. Default: every op.")
@click.option("--dtypes", default="float32", show_default=True,
              help="Comma-separated sample dtypes: float32, float16, bfloat16 (each where the op declares it).")
@click.option("--max-samples", type=click.IntRange(min=1), default=2, show_default=True,
              help="Samples per op and dtype, first ones first.")
@click.option("--max-elements", type=click.IntRange(min=1), default=256, show_default=True,
              help="Skip samples with more input elements than this (inputs are written out as values).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("suites/opinfo"), show_default=True,
              help="Folder of the suites; the suites an earlier import wrote there are replaced, no others.")
@click.option("--profiles", default="", metavar="edge",
              help="Input profiles the samples of elementwise ops (unary and binary ufuncs) also get, each a "
                   "golden of its own: edge, or some of wide,subnormal,signed_zero,max_finite,nonfinite.")
@click.option("--profile-dtypes", default="", metavar="float32",
              help="The sample dtypes that get --profiles (comma-separated); default: every dtype imported.")
@click.option("--all-ops", is_flag=True, help="List every op in the table, not only those skipped whole.")
@guarded
def opinfo(ops, dtypes, max_samples, max_elements, out, profiles, profile_dtypes, all_ops) -> None:
    """Tests from torch's OpInfo database: each op's sample inputs, called as OpInfo calls
    them, with the inputs written into the suite as values. Deterministic: importing
    again gives identical files."""
    from .. import api

    def listed(text: str) -> list[str]:
        return [part.strip() for part in text.split(",") if part.strip()]

    names = [n.strip() for value in ops for n in value.split(";") if n.strip()]
    report = api.import_opinfo(out, ops=names, dtypes=listed(dtypes), max_samples=max_samples,
                               max_elements=max_elements, profiles=listed(profiles),
                               profile_dtypes=listed(profile_dtypes))
    console = Console()
    table = Table(title="OpInfo import" + ("" if all_ops else ": ops skipped whole"))
    for col in ("op", "called as", "samples kept", "skipped samples (why)"):
        table.add_column(col)
    for row in report.rows:
        kept = sum(row.kept.values())
        if not all_ops and kept:
            continue
        why = row.reason or "; ".join(f"{n} {w}" for w, n in row.skipped.most_common())
        kept_text = ", ".join(f"{d} {n}" for d, n in sorted(row.kept.items())) or "0"
        table.add_row(row.name, row.fn or "-", kept_text, why)
    console.print(table)
    reasons = Table(title="Why samples and ops were skipped")
    reasons.add_column("count", justify="right")
    reasons.add_column("reason")
    for why, n in report.skip_reasons().most_common():
        reasons.add_row(str(n), why)
    console.print(reasons)
    echo(f"imported {report.samples} samples of {report.ops} ops into {len(report.files)} suites under {out}")
