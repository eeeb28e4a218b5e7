"""The vocabulary in core/verdicts.py: one precedence over every verdict, groupings that do not
overlap where they must not, and the golden states with the verdict check gives each."""

from __future__ import annotations

from opdiff_snap.core.verdicts import (
    FAILING,
    GOLDEN_PRECEDENCE,
    KINDS,
    NOT_FAILING,
    NOT_RUN,
    PASSING,
    PRECEDENCE,
    QUIET,
    TABLE,
    TABLE_COLUMNS,
    GoldenState,
    Verdict,
    worst_state,
)


def test_precedence_orders_every_verdict_once():
    assert sorted(PRECEDENCE) == sorted(Verdict) and len(PRECEDENCE) == len(set(PRECEDENCE))
    assert PRECEDENCE[0] is Verdict.CRASH and PRECEDENCE[-1] is Verdict.PASS
    # worse than any mismatch: a stage that raised, a dead worker
    for v in (Verdict.EXPORT_FAIL, Verdict.TIMEOUT):
        assert PRECEDENCE.index(v) < PRECEDENCE.index(Verdict.MISMATCH)


def test_every_verdict_is_passing_failing_or_not_run():
    for v in Verdict:
        assert [v in PASSING, v in FAILING, v in NOT_RUN].count(True) == 1, v
    assert QUIET <= NOT_RUN and {Verdict.NO_GOLDEN, Verdict.STALE} <= NOT_RUN
    assert Verdict.CORRUPT in FAILING and Verdict.CRASH in FAILING
    assert NOT_FAILING == PASSING | QUIET     # what fails a run's exit code is another question


def test_kinds_partition_the_verdicts():
    seen = [v for _, group in KINDS for v in group]
    assert sorted(seen) == sorted(Verdict) and len(seen) == len(set(seen))


def test_table_is_the_enum_in_precedence_order():
    assert TABLE_COLUMNS[:2] == ("status", "rank")
    assert [(status, rank) for status, rank, *_ in TABLE] == \
        [(v.value, i) for i, v in enumerate(PRECEDENCE, start=1)]
    flags = {row[0]: dict(zip(TABLE_COLUMNS, row)) for row in TABLE}
    assert {s for s, f in flags.items() if f["not_run"]} == {v.value for v in NOT_RUN}
    assert {s for s, f in flags.items() if f["failing"]} == {v.value for v in FAILING}


def test_golden_states():
    assert sorted(GOLDEN_PRECEDENCE) == sorted(GoldenState)
    assert worst_state([GoldenState.OK, GoldenState.STALE, GoldenState.ORPHAN]) is GoldenState.ORPHAN
    assert worst_state([]) is GoldenState.OK
    assert GoldenState.ORPHAN.verdict is Verdict.STALE and GoldenState.MISSING.verdict is Verdict.NO_GOLDEN
    assert GoldenState.OK.verdict is None and GoldenState.UNKNOWN.verdict is None
    assert f"{GoldenState.UNKNOWN} {GoldenState.OK}" == "? ok"   # as `opdiff goldens ls` shows them
