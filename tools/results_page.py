"""Generate docs/results.md: the shipped suites on every preset that runs here, from real
runs, with every non-PASS explained by a rule in docs/results-notes.yaml.

    python tools/results_page.py --run            # check every preset into store/, then write
    python tools/results_page.py                  # write from the history already in store/
    python tools/results_page.py --before OLD.md  # also: tolerance-choice MISMATCHes then and now
    python tools/results_page.py --run-coverage   # also check suites/opinfo and suites/zoo first
    python tools/results_page.py --coverage-only [--run-coverage]   # only that section of the page

The hand-written suites (suites/*.yaml) get a row per non-PASS, each explained, and say
where a result is not what expectations.yaml expects. The OpInfo and zoo suites (about
4,000 tests, hours per preset here) are read from expectations.yaml, which holds their
known failures on the coverage presets with a reason each: counts per verdict and the
reasons that cover the most ops. --run-coverage checks them again first, each run
rewriting its preset's entries (`--update-expectations`).

A non-PASS that no rule explains is listed as UNEXPLAINED, and so is a known failure with
no reason written; either makes the script exit 1, so the page can never silently carry
an unexplained failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opdiff_snap.analytics.shipped_results import PageRequest, regenerate
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.expectations.known import COVERAGE_PRESETS, page_presets

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="run opdiff check for every preset first")
    ap.add_argument("--presets", default=",".join(page_presets()))
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--store", type=Path, default=ROOT / "store")
    ap.add_argument("--notes", type=Path, default=ROOT / "docs" / "results-notes.yaml")
    ap.add_argument("-o", "--output", type=Path, default=ROOT / "docs" / "results.md")
    ap.add_argument("--before", type=Path, help="an earlier results page, for the before/after table")
    ap.add_argument("--run-coverage", action="store_true",
                    help="check suites/opinfo and suites/zoo on the coverage presets first, each run "
                         "rewriting its preset's entries of the expectations file")
    ap.add_argument("--coverage-presets", default=",".join(COVERAGE_PRESETS))
    ap.add_argument("--expectations", type=Path, default=ROOT / "expectations.yaml",
                    help="the known failures the OpInfo and zoo section is read from")
    ap.add_argument("--coverage-only", action="store_true",
                    help="rewrite only the OpInfo and zoo section of the existing page")
    args = ap.parse_args()
    req = PageRequest(ROOT, args.store, args.notes, args.expectations, args.output,
                      [p for p in args.presets.split(",") if p], [p for p in args.coverage_presets.split(",") if p],
                      args.before, args.jobs, args.run, args.run_coverage, args.coverage_only)
    try:
        return regenerate(req)
    except OpdiffError as exc:
        sys.exit(str(exc))


if __name__ == "__main__":
    sys.exit(main())
