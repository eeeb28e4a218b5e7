"""The expectations file on its own: reading and validating it, matching results to it,
judging a run against it, and updating it from a run. (Checks against it, end to end:
tests/test_expectations_check.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from opdiff_snap.compare.results import Result
from opdiff_snap.core.verdicts import NOT_FAILING, Verdict
from opdiff_snap.expectations.entries import Expectation, Expectations
from opdiff_snap.expectations.file import ExpectationsError, dump, load
from opdiff_snap.expectations.standing import Expecter, Standing
from opdiff_snap.expectations.update import update

PRESETS = ["onnx_cpu_fp32", "onnx_cpu_fp16", "executorch_cpu_fp32", "torch_cpu_fp32"]
FAILING = set(Verdict) - NOT_FAILING
V = Verdict


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "expectations.yaml"
    path.write_text(text)
    return path


def _r(test: str, verdict: Verdict, preset: str = "onnx_cpu_fp32", seed: int = 0) -> Result:
    return Result(test, seed, preset, verdict)


def test_a_file_reads_into_entries_with_their_lines(tmp_path):
    path = _write(tmp_path, "# known\nonnx_cpu_fp32:\n"
                            "  - {test: erfinv, verdict: EXPORT_FAIL, reason: \"no kernel\"}\n"
                            "  - {test: \"conv*\", verdict: mismatch, seed: 1, until: \"onnxruntime<99\"}\n"
                            "\"onnx_*\":\n  - {test: sin, verdict: INFER_FAIL}\n")
    exps = load(path, PRESETS)
    assert [(e.preset, e.test, e.verdict, e.seed, e.line) for e in exps.entries] == [
        ("onnx_cpu_fp32", "erfinv", V.EXPORT_FAIL, None, 3), ("onnx_cpu_fp32", "conv*", V.MISMATCH, 1, 4),
        ("onnx_*", "sin", V.INFER_FAIL, None, 6)]
    assert exps.entries[0].reason == "no kernel" and exps.entries[1].until == "onnxruntime<99"


def test_a_parsed_file_is_kept_signed_and_read_back_only_for_the_same_text_and_presets(tmp_path):
    from opdiff_snap.expectations import parsed_cache

    path = _write(tmp_path, "onnx_cpu_fp32:\n  - {test: erfinv, verdict: EXPORT_FAIL, reason: \"no kernel\"}\n"
                            "  - {test: \"conv*\", verdict: mismatch, seed: 1, until: \"onnxruntime<99\"}\n")
    cache = tmp_path / "cache"
    fresh = load(path, PRESETS, cache=cache)
    [kept] = (cache / "expectations").glob("*.json")
    assert load(path, PRESETS, cache=cache) == fresh == load(path, PRESETS)
    assert parsed_cache.read(cache, fresh.digest, PRESETS) == fresh.entries
    assert parsed_cache.read(cache, fresh.digest, PRESETS[:2]) is None          # other presets: another entry
    # an entry edited by someone without this user's key is not believed: the file is parsed afresh
    kept.write_bytes(kept.read_bytes().replace(b"no kernel", b"a lie"))
    assert parsed_cache.read(cache, fresh.digest, PRESETS) is None
    assert load(path, PRESETS, cache=cache).entries[0].reason == "no kernel"
    kept.write_bytes(b"garbage")
    assert load(path, PRESETS, cache=cache) == fresh
    # another valid text is kept in place of the first: entries of texts gone do not pile up
    path.write_text(path.read_text().replace("no kernel", "still no kernel"))
    assert load(path, PRESETS, cache=cache).entries[0].reason == "still no kernel"
    assert len(list((cache / "expectations").glob("*.json"))) == 1
    # a changed file is another text: parsed (and its problems reported) whatever is kept
    path.write_text(path.read_text().replace("EXPORT_FAIL", "EXPORT_FAILED"))
    with pytest.raises(ExpectationsError, match="EXPORT_FAILED"):
        load(path, PRESETS, cache=cache)
    with pytest.raises(ExpectationsError, match="EXPORT_FAILED"):
        load(path, PRESETS, cache=cache)


def test_every_problem_of_a_malformed_file_is_named_with_its_line_and_nothing_is_read(tmp_path):
    path = _write(tmp_path, "onnx_cpu_fp23:\n  - {test: a, verdict: EXPORT_FAIL}\n"
                            "onnx_cpu_fp32:\n"
                            "  - {test: b, verdict: EXPORT_FAILED}\n"
                            "  - {test: \"c[\", verdict: MISMATCH}\n"
                            "  - {test: d, verdict: MISMATCH, until: \"onnxruntime<<1\"}\n"
                            "  - {test: e, verdict: MISMATCH}\n"
                            "  - {test: e, verdict: CRASH}\n"
                            "  - {test: f, verdict: PASS, colour: red}\n"
                            "\"tensorrt_*\":\n  - {test: g, verdict: CRASH}\n")
    with pytest.raises(ExpectationsError) as err:
        load(path, PRESETS)
    text = str(err.value)
    assert "problems in the expectations file" in text
    lines = {p.line: p.message for p in err.value.problems}
    assert "unknown preset 'onnx_cpu_fp23'" in lines[1] and "onnx_cpu_fp32" in lines[1]   # suggested
    assert "EXPORT_FAILED" in lines[4] and "EXPORT_FAIL" in lines[4]
    assert "not a valid glob" in lines[5]
    assert "version range" in lines[6]
    assert "duplicate" in lines[8] and "line 7" in lines[8]
    assert any("colour" in p.message for p in err.value.problems)
    assert any("PASS" in p.message and p.line == 9 for p in err.value.problems)
    assert "matches no preset" in lines[10]
    assert all(str(path) in str(p) for p in err.value.problems)


def test_the_most_specific_expectation_names_a_result():
    exps = Expectations([Expectation("onnx_*", "conv*", V.MISMATCH), Expectation("onnx_cpu_fp32", "conv*", V.CRASH),
                         Expectation("onnx_cpu_fp32", "conv2d", V.EXPORT_FAIL),
                         Expectation("onnx_cpu_fp32", "conv2d", V.INFER_FAIL, seed=1)])
    assert exps.match("onnx_cpu_fp32", "conv2d", 0).verdict is V.EXPORT_FAIL
    assert exps.match("onnx_cpu_fp32", "conv2d", 1).verdict is V.INFER_FAIL
    assert exps.match("onnx_cpu_fp32", "conv1d", 0).verdict is V.CRASH
    assert exps.match("onnx_cpu_fp16", "conv1d", 0).verdict is V.MISMATCH
    assert exps.match("torch_cpu_fp32", "conv1d", 0) is None


def test_a_run_is_judged_expected_new_different_and_unexpectedly_passing():
    versions = {"onnxruntime": "1.31.1"}.get
    exps = Expectations([Expectation("onnx_cpu_fp32", "a", V.EXPORT_FAIL),
                         Expectation("onnx_cpu_fp32", "b", V.EXPORT_FAIL),
                         Expectation("onnx_cpu_fp32", "c", V.MISMATCH),
                         Expectation("onnx_cpu_fp32", "old", V.MISMATCH, until="onnxruntime<1.30"),
                         Expectation("onnx_cpu_fp32", "now", V.MISMATCH, until="onnxruntime>=1.31,<1.32")])
    expecter = Expecter(exps, FAILING, versions)
    results = [_r("a", V.EXPORT_FAIL), _r("b", V.MISMATCH), _r("c", V.PASS), _r("d", V.CRASH), _r("e", V.PASS),
               _r("old", V.MISMATCH), _r("now", V.MISMATCH), _r("f", V.UNAVAILABLE)]
    for r in results:
        expecter(r)
    assert [r.expected for r in results] == [V.EXPORT_FAIL, V.EXPORT_FAIL, V.MISMATCH, None, None, None,
                                             V.MISMATCH, None]
    report = expecter.report(results)
    assert [j.standing for j in report.judged] == [
        Standing.EXPECTED, Standing.DIFFERENT, Standing.UNEXPECTED_PASS, Standing.NEW, Standing.PASSED,
        Standing.NEW, Standing.EXPECTED, Standing.QUIET]
    assert [e.test for e in report.expired] == ["old"]     # expired: it excuses nothing
    assert report.fails(strict=True) and report.fails(strict=False)
    only_pass = Expecter(exps, FAILING, versions).report([_r("a", V.EXPORT_FAIL), _r("c", V.PASS)])
    assert only_pass.fails(strict=True) and not only_pass.fails(strict=False)


def test_an_update_makes_the_file_agree_with_the_run_and_touches_nothing_else(tmp_path):
    exps = Expectations([Expectation("onnx_cpu_fp32", "a", V.EXPORT_FAIL, reason="kept reason"),
                         Expectation("onnx_cpu_fp32", "b", V.EXPORT_FAIL, reason="why b"),
                         Expectation("onnx_cpu_fp32", "gone", V.MISMATCH),
                         Expectation("onnx_cpu_fp32", "elsewhere", V.CRASH),     # not in the run
                         Expectation("torch_cpu_fp32", "a", V.CRASH),            # another preset
                         Expectation("onnx_cpu_fp32", "g*", V.MISMATCH)], str(tmp_path / "e.yaml"))
    results = [_r("a", V.EXPORT_FAIL), _r("b", V.MISMATCH), _r("gone", V.PASS), _r("new", V.CRASH),
               _r("s", V.MISMATCH, seed=0), _r("s", V.PASS, seed=1), _r("g1", V.PASS), _r("g2", V.PASS)]
    after, changes = update(exps, results, FAILING)
    keys = {(e.preset, e.test, e.seed): e for e in after.entries}
    assert keys[("onnx_cpu_fp32", "a", None)].reason == "kept reason"
    assert keys[("onnx_cpu_fp32", "b", None)].verdict is V.MISMATCH and keys[("onnx_cpu_fp32", "b", None)].reason
    assert ("onnx_cpu_fp32", "gone", None) not in keys
    assert ("onnx_cpu_fp32", "g*", None) in keys     # a glob may name what the run did not check
    assert keys[("onnx_cpu_fp32", "new", None)].verdict is V.CRASH
    assert keys[("onnx_cpu_fp32", "s", 0)].verdict is V.MISMATCH and ("onnx_cpu_fp32", "s", None) not in keys
    assert ("onnx_cpu_fp32", "elsewhere", None) in keys and ("torch_cpu_fp32", "a", None) in keys
    assert sorted(changes.lines()) == sorted([
        "+ onnx_cpu_fp32: new CRASH", "+ onnx_cpu_fp32: s seed 0 MISMATCH",
        "~ onnx_cpu_fp32: b EXPORT_FAIL -> MISMATCH",
        "- onnx_cpu_fp32: gone MISMATCH (passes now)",
        "? onnx_cpu_fp32: g* MISMATCH (a glob, line None): every result it names in this run passes; remove it "
        "by hand if it is fixed everywhere it names"])
    # what it writes reads back the same, and a second update changes nothing
    path = tmp_path / "e.yaml"
    path.write_text(dump(after))
    again = load(path, PRESETS)
    def rows(x: Expectations) -> list:
        return sorted((str(e.key), e.verdict, e.reason) for e in x.entries)

    assert rows(again) == rows(after)
    assert not update(again, results, FAILING)[1]
    judged = Expecter(again, FAILING).report([r for r in results if not r.test_id.startswith("g")])
    assert not judged.fails()


def _settled(entries: list[Expectation], results: list[Result], versions=None) -> Expectations:
    """The file after an update from `results`; the same run against it passes, and a second
    update changes nothing."""
    after, _ = update(Expectations(entries), results, FAILING, versions or {}.get)
    assert not Expecter(after, FAILING, versions or {}.get).report(results).fails()
    assert not update(after, results, FAILING, versions or {}.get)[1]
    return after


def test_an_update_folds_seeds_keeps_what_agrees_and_rewrites_expired_entries():
    # per-seed entries fold into one for every seed, when every seed now fails alike
    after = _settled([Expectation("onnx_cpu_fp32", "t", V.MISMATCH, "seed one", seed=1)],
                     [_r("t", V.EXPORT_FAIL, seed=0), _r("t", V.EXPORT_FAIL, seed=1)])
    assert [(e.seed, e.verdict, e.reason) for e in after.entries] == [(None, V.EXPORT_FAIL, "seed one")]
    # a run of one seed that agrees with its per-seed entry changes nothing
    kept = [Expectation("onnx_cpu_fp32", "t", V.MISMATCH, seed=0)]
    assert _settled(kept, [_r("t", V.MISMATCH, seed=0)]).entries == kept
    # skipped and unavailable results say nothing
    assert _settled(kept, [_r("t", V.MISMATCH, seed=0), _r("t", V.SKIPPED, seed=1)]).entries == kept
    # an entry whose `until` has expired is rewritten without it
    old = [Expectation("onnx_cpu_fp32", "t", V.EXPORT_FAIL, "why", until="onnxruntime<1.0")]
    versions = {"onnxruntime": "1.31.1"}.get
    after = _settled(old, [_r("t", V.EXPORT_FAIL)], versions)
    assert [(e.verdict, e.reason, e.until) for e in after.entries] == [(V.EXPORT_FAIL, "why", "")]


def test_an_id_with_glob_characters_names_its_own_test_first():
    e = Expectation("onnx_cpu_fp32", "conv[3x3]", V.MISMATCH)
    assert e.names("onnx_cpu_fp32", "conv[3x3]", 0)
    exps = Expectations([Expectation("onnx_cpu_fp32", "conv*", V.CRASH), e])
    assert exps.match("onnx_cpu_fp32", "conv[3x3]", 0) is e
    assert _settled([e], [_r("conv[3x3]", V.MISMATCH)]).entries == [e]


def test_matching_by_index_agrees_with_reading_every_entry():
    """A result is looked up among its own id's entries and the glob ones; that gives what a
    scan of every entry in file order gives (the most specific, the first written of equals),
    also after entries are added (to the list, or through the index), removed (from the list,
    or through the index) or replaced in place."""
    import itertools
    import random

    tests = ["erfinv", "conv2d", "conv3d", "pair[0]", "sin@subnormal", "nn_gru@T=9"]
    patterns = tests + ["conv*", "*@subnormal", "pair[[]0]", "nn_gru@*", "*"]
    rng = random.Random(7)
    entries = [Expectation(rng.choice(PRESETS + ["onnx_*", "*"]), rng.choice(patterns),
                           rng.choice([V.EXPORT_FAIL, V.MISMATCH]), seed=rng.choice([None, None, 0, 1]))
               for _ in range(60)]
    exps = Expectations(entries)
    gone: set[int] = set()

    def scanned(preset, test, seed):
        found = [e for i, e in enumerate(exps.entries) if i not in gone and e.names(preset, test, seed)]
        return max(found, key=lambda e: e.specificity(preset, test)) if found else None

    def agree():
        for preset, test, seed in itertools.product(PRESETS, tests, (0, 1)):
            assert exps.match(preset, test, seed) is scanned(preset, test, seed), (preset, test, seed)
            assert exps.position((preset, test, seed)) == next(
                (i for i, e in enumerate(exps.entries) if i not in gone and e.key == (preset, test, seed)), None)

    agree()
    entries.append(Expectation("onnx_cpu_fp32", "sin@subnormal", V.INFER_FAIL, seed=1))
    agree()
    del entries[:5]
    entries.append(Expectation("torch_cpu_fp32", "erfinv", V.CRASH))
    entries.append(Expectation("torch_cpu_fp32", "conv3d", V.CRASH))
    agree()
    for i in range(0, len(entries), 3):      # replaced in place: the same size
        entries[i] = Expectation("executorch_cpu_fp32", rng.choice(tests), V.LOAD_FAIL)
    exps.changed()
    agree()
    for pattern in ("conv2d", "conv*", "nn_gru@T=9", "*@subnormal"):   # added through the index
        exps.append(Expectation("onnx_cpu_fp32", pattern, V.CRASH, seed=0))
        agree()
    for at in rng.sample(range(len(exps.entries)), 12):     # removed through the index
        exps.forget(at)
        gone.add(at)
        agree()
    exps.append(Expectation("onnx_cpu_fp32", "erfinv", V.SHAPE_MISMATCH))
    agree()
    assert exps.kept() == [e for i, e in enumerate(exps.entries) if i not in gone]
    # an id holding a glob character names its own entry, for `about` too (what may expire)
    own = Expectations([Expectation("onnx_cpu_fp32", "pair[0]", V.MISMATCH)])
    assert own.match("onnx_cpu_fp32", "pair[0]", 0) is own.entries[0]
    assert own.about(["onnx_cpu_fp32"], ["pair[0]"]) == own.entries
