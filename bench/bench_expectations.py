"""Judging results against the shipped expectations file: every shipped test id on each
preset the file names, looked up as a check looks up its results, against a scan of every
entry for each result (what the lookup did before it was indexed by test id). Then
`--update-expectations` after a run of one preset over every shipped test in which
`--new` tests fail that no entry expects and `--fixed` expected ones pass: with the index
kept as entries are added and removed, rebuilt after each removal (what the update did
before), and after each change (before that).

    python bench/bench_expectations.py [--scan-sample 2000] [--new 2000] [--fixed 200]
"""

from __future__ import annotations

import argparse

from benchlib import ROOT, timed

from opdiff_snap import api
from opdiff_snap.compare.results import Result
from opdiff_snap.core.verdicts import FAILING, Verdict
from opdiff_snap.expectations.entries import Expectation, Expectations
from opdiff_snap.expectations.update import update


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scan-sample", type=int, default=2000,
                        help="results judged by scanning every entry (the whole run would take minutes)")
    parser.add_argument("--new", type=int, default=2000, help="failures the file does not expect yet")
    parser.add_argument("--fixed", type=int, default=200, help="expected failures that pass now")
    args = parser.parse_args()
    expectations = api.load_expectations(ROOT / "expectations.yaml")
    ids = [c.id for c in api.list_tests(settings=api.Settings(suites=ROOT / "suites"))]
    presets = sorted({e.preset for e in expectations.entries})
    lookups = [(p, i) for p in presets for i in ids]

    found, indexed = timed(lambda: sum(expectations.match(p, i, 0) is not None for p, i in lookups))

    sample = lookups[:: max(1, len(lookups) // args.scan_sample)]
    _, scanned = timed(lambda: [scan(expectations, p, i) for p, i in sample])

    per_indexed = indexed / len(lookups) * 1e6
    per_scanned = scanned / len(sample) * 1e6
    print(f"{len(expectations)} entries, {len(ids)} shipped tests, {len(presets)} presets: "
          f"{len(lookups)} lookups, {found} expected")
    print(f"indexed by test id: {indexed:.2f} s ({per_indexed:.1f} us per result)")
    print(f"scan of every entry: {per_scanned:.0f} us per result ({len(sample)} results), "
          f"{per_scanned / per_indexed:.0f}x; for one preset's {len(ids)} results "
          f"{per_scanned * len(ids) / 1e6:.1f} s each time a run judges them")
    bench_update(expectations, ids, args.new, args.fixed)


def scan(expectations: Expectations, preset: str, test: str) -> Expectation | None:
    """The most specific entry naming a result, found by scanning every entry."""
    named = [e for e in expectations.entries if e.names(preset, test, 0)]
    return max(named, key=lambda e: e.specificity(preset, test)) if named else None


def bench_update(expectations: Expectations, ids: list[str], new: int, fixed: int) -> None:
    preset = max({e.preset for e in expectations.entries},
                 key=lambda p: sum(e.preset == p for e in expectations.entries))
    expected = {e.test: e.verdict for e in expectations.entries if e.preset == preset and e.seed is None}
    passing = [i for i in ids if i not in expected]
    fixed_ids = set(list(expected)[:fixed])
    new_ids = set(passing[:new])
    results = [Result(i, 0, preset, Verdict.MISMATCH if i in new_ids else
                      Verdict.PASS if i in fixed_ids or i not in expected else expected[i]) for i in ids]

    def rebuilding(self: Expectations, entry: Expectation) -> None:
        self.entries.append(entry)
        self.changed()

    def popping(self: Expectations, at: int) -> Expectation:
        entry = self.entries.pop(at)
        self.changed()
        return entry

    timings = {}
    variants = (("index kept", Expectations.append, Expectations.forget),
                ("index rebuilt per entry removed", Expectations.append, popping),
                ("index rebuilt per entry added or removed", rebuilding, popping))
    for name, append, forget in variants:
        kept = Expectations.append, Expectations.forget
        Expectations.append, Expectations.forget = append, forget   # type: ignore[method-assign]
        try:
            (after, changes), timings[name] = timed(lambda: update(Expectations(list(expectations.entries)),
                                                                   results, FAILING))
        finally:
            Expectations.append, Expectations.forget = kept   # type: ignore[method-assign]
        print(f"update, {name}: {timings[name]:.2f} s ({len(results)} results of {preset}: "
              f"{len(changes.added)} added, {len(changes.removed)} removed; {len(after)} entries after)")


if __name__ == "__main__":
    main()
