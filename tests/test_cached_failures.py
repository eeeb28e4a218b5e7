"""A deterministic EXPORT_FAIL or LOAD_FAIL is kept in the artifact cache and served from
it, with its original message, on the next check with the same inputs, marked cached in
the history and the table; --no-cache asks the backend again; a timeout is never kept.
Real ONNX export and ONNX Runtime: `i0` has no ONNX translation (EXPORT_FAIL), `mm_bf16`
exports but ONNX Runtime has no bfloat16 MatMul kernel (LOAD_FAIL)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.check import shipped_goldens

from opdiff_snap import api
from opdiff_snap.cli import main
from opdiff_snap.core.config import Settings
from opdiff_snap.core.verdicts import Verdict

REPO = Path(__file__).resolve().parents[1]
SUITE = REPO / "suites" / "core_aten.yaml"
FAILING = {"i0": Verdict.EXPORT_FAIL, "mm_bf16": Verdict.LOAD_FAIL}
PRESET = "onnx_cpu_fp32"

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning")]


def _project(root: Path) -> Settings:
    return shipped_goldens(root, FAILING)


def _check(settings: Settings, use_cache: bool = True):
    report = api.check(api.CheckRequest([PRESET], api.Selection([SUITE], test_ids=list(FAILING)),
                                        api.Running(in_process=True, use_cache=use_cache)), settings=settings)
    return {r.test_id: r for r in report.results}


def _items(path: Path) -> dict[str, dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return {d["id"]: d for d in lines if d.get("type") == "item"}


def _failure_records(settings: Settings) -> list[Path]:
    return sorted((Path(settings.cache) / "failures").glob("*/*.json"))


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    settings = _project(tmp_path_factory.mktemp("cached-failures"))
    return settings, _check(settings)


def test_the_first_run_asks_the_backend_and_keeps_each_failure(cold):
    settings, results = cold
    for test_id, verdict in FAILING.items():
        assert results[test_id].verdict is verdict, results[test_id].message
        assert not results[test_id].cache_hit
    assert len(_failure_records(settings)) == len(FAILING)


def test_a_re_check_serves_them_from_the_cache_with_the_original_message(cold):
    settings, first = cold
    none = Path(settings.store).parent / "no-expectations.yaml"   # not the project's: these fail
    none.write_text("")
    cli = CliRunner().invoke(main, ["--goldens", str(settings.goldens), "--store", str(settings.store),
                                    "--cache", str(settings.cache), "check", str(SUITE), "-b", PRESET,
                                    "--in-process", "-j", "1", "--repeats", "1",
                                    "--test-ids", ";".join(FAILING), "--expectations", str(none)])
    assert cli.exit_code == 1, cli.output
    assert "EXPORT_FAIL (cached)" in cli.output and "LOAD_FAIL (cached)" in cli.output
    runs = sorted((Path(settings.store) / "runs").glob("*.jsonl"))
    before, after = _items(runs[0]), _items(runs[-1])
    for test_id in FAILING:
        a, b = before[test_id], after[test_id]
        assert b["cache_hit"] is True and a["cache_hit"] is False
        for key in ("status", "error_class", "error_message", "unsupported_ops"):
            assert b[key] == a[key], key
        assert b["unsupported_ops"], "the survey of the test's ops is kept with the failure"
    assert first["i0"].message == api.query(
        "SELECT error_message FROM results WHERE test_id = 'i0' AND cache_hit", settings).rows[0][0]


def test_no_cache_asks_the_backend_again(cold):
    settings, first = cold
    again = _check(settings, use_cache=False)
    for test_id, verdict in FAILING.items():
        assert again[test_id].verdict is verdict and not again[test_id].cache_hit
        assert again[test_id].message == first[test_id].message


def test_a_timeout_is_never_kept(tmp_path):
    settings = _project(tmp_path)
    cli = CliRunner().invoke(main, ["--goldens", str(settings.goldens), "--store", str(settings.store),
                                    "--cache", str(settings.cache), "check", str(SUITE), "-b", PRESET,
                                    "-j", "1", "--timeout-s", "0.1", "--test-ids", "i0"])
    assert "TIMEOUT" in cli.output, cli.output
    assert _failure_records(settings) == []


def _raised(call):
    try:
        call()
    except BaseException as exc:   # noqa: BLE001 - the exception is the subject
        return exc
    raise AssertionError("it did not raise")


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_fault_of_our_own_code_is_never_kept_as_the_backends_answer():
    """A plain Python error raised inside opdiff_snap (here: export_dims handed an axis
    that is no DynamicDim, as when a worker mixes two versions of the package) is a bug of
    the tool that its next edit fixes: it must not be served from the cache afterwards.
    The same error raised by the backend's library, one of the tool's own refusals, and an
    error of the machine keep their behaviour."""
    import torch

    from opdiff_snap.backends.family_common import export_dims
    from opdiff_snap.core.errors import OpdiffError
    from opdiff_snap.execution.cache import deterministic, own_bug
    from opdiff_snap.history.sharding import parse_shard

    ours = _raised(lambda: export_dims(({0: object()},)))
    assert isinstance(ours, AttributeError) and own_bug(ours) and not deterministic(ours)
    theirs = _raised(lambda: torch.export.Dim("x", min=2, max=3) * object())   # raised inside torch
    assert type(theirs).__module__ == "builtins" and not own_bug(theirs) and deterministic(theirs), theirs
    refusal = _raised(lambda: parse_shard("0/4"))        # an error of ours, raised on purpose in the package
    assert isinstance(refusal, OpdiffError) and not own_bug(refusal) and deterministic(refusal)
    assert not deterministic(_raised(lambda: open("/nonexistent/dir/file")))


@pytest.mark.parametrize("planted", ["[1]", '{"verdict": "PASS"}', '{"verdict": "EXPORT_FAIL", "error_message": 5}'])
def test_a_remembered_failure_of_another_shape_is_asked_again(cold, tmp_path, planted):
    settings, _ = cold
    cache = tmp_path / "cache"
    shutil.copytree(settings.cache, cache)
    for record in _failure_records(settings.with_overrides(cache=cache)):
        record.write_text(planted)
    again = _check(settings.with_overrides(cache=cache))
    assert {t: r.verdict for t, r in again.items()} == FAILING
    assert not any(r.cache_hit for r in again.values())           # asked the backend again


@pytest.mark.parametrize("planted", ["[1]", '{"artifact": "../../elsewhere"}', '{"export_ms": "slow"}'])
def test_a_cache_entry_of_another_shape_is_rebuilt(tmp_path, planted):
    """An artifact cache entry whose entry.json is not what the cache writes is rebuilt,
    and never stops the check (`[1]` used to be an internal error)."""
    from opdiff_snap.execution.cache import ArtifactCache, holds_artifacts_of

    settings = Settings(suites=SUITE.parent, goldens=REPO / "goldens", store=tmp_path / "store",
                        cache=tmp_path / "cache", jobs=1, repeats=1)
    first = api.check(api.CheckRequest(backends=[PRESET], selection=api.Selection(suites=[SUITE], test_ids=["abs"]),
                                       running=api.Running(in_process=True)), settings=settings)
    assert [r.verdict for r in first.results] == [Verdict.PASS]
    (entry,) = sorted(Path(settings.cache).glob("*/*/entry.json"))
    entry.write_text(planted)
    assert not holds_artifacts_of(settings.cache, PRESET)
    assert ArtifactCache(settings.cache).lookup(entry.parent.name) is None
    again = api.check(api.CheckRequest(backends=[PRESET], selection=api.Selection(suites=[SUITE], test_ids=["abs"]),
                                       running=api.Running(in_process=True)), settings=settings)
    assert [(r.verdict, r.cache_hit) for r in again.results] == [(Verdict.PASS, False)]
