"""`check --shard K/N --run-group ID`: the split is deterministic, exact and even; N shards
of a real check together give exactly the items of one unsharded run (SQL over the group),
and `runs`, diff-runs and resume take the shards as they should."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import pytest
from helpers.record import record_here

from opdiff_snap import api
from opdiff_snap.analytics.reports import diff_runs
from opdiff_snap.core.config import Settings
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.history import sharding
from opdiff_snap.history.runs import group_runs, list_runs
from opdiff_snap.run.session import RunListener
from opdiff_snap.suite.given import given_cases

ROOT = Path(__file__).resolve().parents[1]
SUITE = """\
presets:
  x: {type: tensor, shape: [2, 4], dtype: float32, init: normal}
tests:
""" + "".join(f"  - {{id: op{i}, op: aten::{op}, in: [{{ref: x}}]}}\n"
              for i, op in enumerate(["relu.default", "exp.default", "tanh.default", "sigmoid.default",
                                      "abs.default", "neg.default", "sin.default", "cos.default",
                                      "sqrt.default"]))


def test_split_of_the_shipped_suites_is_deterministic_exact_and_even():
    with contextlib.chdir(ROOT):
        cases = given_cases(None, Path("suites"))
    keys = [(c.id, s, p) for c in cases for s in c.seeds for p in ("onnx_cpu_fp32", "executorch_cpu_fp32")]
    # hand-written (43 with 5 edge profiles, 76 sized), OpInfo (2,764 samples, 1,232 edge goldens), zoo
    # (each at 2 more sizes; 29 models and 11 image-size variants of the vision ones)
    # and every edge profile again in fp16's and bf16's values
    assert len(keys) == 2 * (530 + 43 * 5 + 76 + 2764 + 1232 + (29 + 11) * 3 + 2 * (43 * 5 + 1 + 1232))
    by_count = sharding.partition(keys, sharding.expected_costs(keys, {}), 4)
    assert sorted(k for s in by_count for k in s) == sorted(keys)               # each key exactly once
    assert max(map(len, by_count)) - min(map(len, by_count)) <= 1                # even by count
    assert sharding.partition(list(reversed(keys)), sharding.expected_costs(keys, {}), 4) == by_count

    rng = random.Random(3)   # latencies as skewed as real ones: a few exports cost 100x the rest
    known = {(t, p): rng.lognormvariate(5, 1.5) for t, _, p in keys}
    costs = sharding.expected_costs(keys, known)
    split = sharding.partition(keys, costs, 4)
    assert sorted(k for s in split for k in s) == sorted(keys)
    loads = [sum(costs[k] for k in s) for s in split]
    assert max(loads) / (sum(loads) / 4) <= 1.05
    naive = [keys[i::4] for i in range(4)]                                       # what counts alone give
    naive_loads = [sum(costs[k] for k in s) for s in naive]
    assert max(naive_loads) / (sum(naive_loads) / 4) > max(loads) / (sum(loads) / 4)


def test_a_split_says_how_even_it_is_and_where_its_costs_came_from():
    keys = [(f"t{i}", 0, "p") for i in range(6)]
    known = {("t0", "p"): 600.0, ("t1", "p"): 100.0, ("t2", "p"): 100.0}
    split = sharding.split_jobs(keys, known, decided=[("t5", 0, "p")], n=2)
    # t3 and t4 cost the preset's median (100 ms), t5 was decided by planning and costs nothing
    assert sorted(split.expected_ms) == [400.0, 600.0] and split.from_history == 3
    assert split.longest_over_mean() == pytest.approx(1.2)
    text = split.describe(1)
    assert text.startswith("shard 1/2: 1 of 6 jobs") and "1.20x the mean" in text
    assert "3 of 6 jobs costed from their own latest result" in text
    assert "split is by count" in sharding.split_jobs(keys, {}, (), 3).describe(2)
    assert sharding.over_mean([]) is None and sharding.over_mean([0.0, 0.0]) is None


def test_costs_come_from_the_latest_results_and_fall_back_to_the_preset_median():
    item = {"status": "PASS", "export_ms": 100.0, "load_ms": 10.0, "infer_ms_all": [1.0, 3.0, 2.0]}
    assert sharding.job_cost(item, repeats=3, warmup=1) == pytest.approx(sharding.DISPATCH_MS + 110 + 2 * 4)
    assert sharding.job_cost({"status": "NO_GOLDEN"}, 3, 1) is None
    keys = [("a", 0, "p"), ("b", 0, "p"), ("c", 0, "p"), ("d", 0, "q")]
    costs = sharding.expected_costs(keys, {("a", "p"): 10.0, ("b", "p"): 30.0}, decided=[("d", 0, "q")])
    assert costs == {("a", 0, "p"): 10.0, ("b", 0, "p"): 30.0, ("c", 0, "p"): 20.0, ("d", 0, "q"): 0.0}
    for bad in ("0/4", "5/4", "2", "a/b", ""):
        with pytest.raises(OpdiffError, match="--shard"):
            sharding.parse_shard(bad)


@pytest.mark.slow
def test_four_shards_give_exactly_the_items_of_one_unsharded_run(tmp_path):
    settings = Settings(repeats=1, warmup=0, jobs=1)
    record_here(tmp_path, SUITE, settings)
    with contextlib.chdir(tmp_path):
        whole = api.check(api.CheckRequest(backends=["torch_cpu_fp32"], running=api.Running(in_process=True)),
                                           settings=settings)
        with pytest.raises(OpdiffError, match="needs --run-group"):
            api.check(api.CheckRequest(backends=["torch_cpu_fp32"], running=api.Running(in_process=True),
                                       shard=(1, 4)), settings=settings)
        told: list[str] = []

        class Notices(RunListener):
            def notice(self, text: str) -> None:
                told.append(text)

        shards = [api.check(api.CheckRequest(backends=["torch_cpu_fp32"], running=api.Running(in_process=True),
                                             shard=(k, 4), run_group="g1"), settings=settings, listener=Notices())
                  for k in range(1, 5)]
        # each shard says what it takes and how even the split is expected to be, costed from the history
        assert [t.split(":")[0] for t in told if t.startswith("shard ")] == [f"shard {k}/4" for k in range(1, 5)]
        assert all("the longest shard is" in t and "9 of 9 jobs costed from their own latest result" in t
                   for t in told if t.startswith("shard "))
        # split by the unsharded run's timings, so not necessarily by count
        assert sum(len(r.results) for r in shards) == 9 and all(r.results for r in shards)
        group = "SELECT test_id, seed, preset FROM results JOIN runs USING (run_id) WHERE run_group = 'g1'"
        one = f"SELECT test_id, seed, preset FROM results WHERE run_id = '{whole.run_id}'"
        rows = api.query(f"""SELECT (SELECT count(*) FROM ({group})),
                                    (SELECT count(*) FROM (SELECT DISTINCT * FROM ({group}))),
                                    (SELECT count(*) FROM ({one})),
                                    (SELECT count(*) FROM (({group}) EXCEPT ({one}))),
                                    (SELECT count(*) FROM (({one}) EXCEPT ({group})))""").rows
        assert rows == [(9, 9, 9, 0, 0)]
        assert api.query("SELECT DISTINCT shard FROM runs WHERE run_group = 'g1' ORDER BY 1").rows == \
            [("1/4",), ("2/4",), ("3/4",), ("4/4",)]

        # the split was stored once; every shard used it
        splits = list(Path("store/shards").glob("*.json"))
        assert len(splits) == 1
        split = json.loads(splits[0].read_text())
        assert [sorted(tuple(k) for k in s) for s in split["shards"]] == \
            [sorted(r.key for r in shard.results) for shard in shards]
        assert len(split["expected_ms"]) == 4 and split["from_history"] == 9

        [g] = group_runs(list_runs(Path("store")))
        assert g.run_group == "g1" and g.complete and g.counts == {"PASS": 9} and len(g.runs) == 4
        measured, expected = g.shard_balance()   # the longest shard over the mean, from wall times and the split
        assert measured is not None and measured >= 1.0
        assert expected == pytest.approx(max(split["expected_ms"]) / (sum(split["expected_ms"]) / 4))
        diff = diff_runs(Path("store"), whole.run_id, "g1")
        assert (diff.only_a, diff.only_b, len(diff.newly_failing)) == (0, 0, 0)

        # an interrupted shard (its last item and end line lost) resumes as the same shard only
        cut = max(shards, key=lambda r: len(r.results))
        lines = cut.path.read_text().splitlines(keepends=True)
        cut.path.write_text("".join(lines[:-2]))
        k = shards.index(cut) + 1
        with pytest.raises(OpdiffError, match="shard"):
            api.check(api.CheckRequest(backends=["torch_cpu_fp32"], running=api.Running(in_process=True),
                                       shard=(k % 4 + 1, 4), run_group="g1", resume=cut.run_id), settings=settings)
        done = api.check(api.CheckRequest(backends=["torch_cpu_fp32"], running=api.Running(in_process=True),
                                          shard=(k, 4), run_group="g1", resume=cut.run_id), settings=settings)
        assert sorted(r.key for r in done.results) == sorted(r.key for r in cut.results)
