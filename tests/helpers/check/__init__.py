"""Fixtures for tests/test_check_*.py: a registered perturbing backend, recorded projects,
and running the real CLI in a subprocess with it installed."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from opdiff_snap.core.config import Settings
from opdiff_snap.goldens import GoldenInfo, GoldenStore

from .. import REPO, TESTS
from ..cli import MODULE, run, start

HERE = Path(__file__).resolve().parent
ENTRY_POINTS = "[opdiff_snap.backends]\nperturb = helpers.check.opdiff_perturb:PerturbBackend\n"


def make_site(root: Path, entry_points: str = ENTRY_POINTS, name: str = "opdiff-perturb-test",
              version: str = "1.0") -> Path:
    """A directory holding only a *.dist-info that registers test backends (by default
    the perturbing one) through the entry point group `opdiff_snap.backends`."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(entry_points)
    return root


@contextlib.contextmanager
def plugin_installed(site: Path):
    """The perturbing backend visible to this process (and to workers it spawns)."""
    from opdiff_snap.backends.registry import reload_plugins

    sys.path.insert(0, str(site))
    reload_plugins()
    try:
        yield
    finally:
        sys.path.remove(str(site))
        reload_plugins()


def new_project(root: Path, *suites: str) -> Path:
    """root/suites/ holding the named files of this folder (plus mods.py)."""
    (root / "suites").mkdir(parents=True)
    for name in (*suites, "mods.py"):
        shutil.copy(HERE / name, root / "suites" / name)
    return root


def recorded_suite30(root: Path) -> Path:
    """root/ holding suite30.yaml recorded once on torch_cpu_fp32 (in-process, relative paths):
    the project the checks of the perturbing backend run on."""
    from opdiff_snap import api

    new_project(root, "suite30.yaml")
    with contextlib.chdir(root):
        report = api.record(api.RecordRequest(running=api.Running(in_process=True)),
                                              settings=Settings(repeats=1, warmup=0))
    assert report.counts() == {"RECORDED": 32}
    return root


def perturbed_ids(root: Path) -> set[str]:
    """The tests of root's suite30.yaml that run aten::exp or aten::tanh (tagged so)."""
    from opdiff_snap.suite import load_suites

    with contextlib.chdir(root):
        return {c.id for c in load_suites([Path("suites/suite30.yaml")]) if "uses_exp_or_tanh" in c.tags}


def copy_project(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".opdiff-cache"))
    return dst


def cli_env(site: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["COLUMNS"] = "200"
    return env


def opdiff(cwd: Path, site: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m opdiff_snap.cli ARGS` in `cwd`, with the perturbing backend installed."""
    return run(cwd, *args, entry=MODULE, env=cli_env(site), timeout=timeout)


def opdiff_popen(cwd: Path, site: Path, *args: str) -> subprocess.Popen:
    return start(cwd, *args, entry=MODULE, env=cli_env(site), start_new_session=True)


def flip_byte(path: Path, offset: int = 3) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def copy_shipped(goldens: Path, keep: Callable[[GoldenInfo], bool]) -> list[str]:
    """Copies of the shipped goldens `keep` selects, written into the store at `goldens` as
    record writes them (loose; the shipped store holds most goldens in packs). Their keys."""
    shipped, store = GoldenStore(REPO / "goldens"), GoldenStore(goldens)
    store.check_writable()
    keys = []
    for info in shipped.index():
        if not info.problem and keep(info):
            store.write(shipped.read(info.test_id, info.seed))
            keys.append(info.key)
    return keys


def shipped_goldens(root: Path, test_ids) -> Settings:
    """A project holding copies of the shipped goldens of `test_ids` (seed 0; no record
    needed), its suites the shipped ones, checked one job at a time with one repeat."""
    goldens = root / "goldens"
    wanted = set(test_ids)
    copied = copy_shipped(goldens, lambda info: info.seed == 0 and info.key.rsplit("-", 2)[0] in wanted)
    assert len(copied) == len(wanted), (copied, wanted)
    return Settings(suites=REPO / "suites", goldens=goldens, store=root / "store", cache=root / "cache",
                    jobs=1, repeats=1)


def assert_same_as_alone(batched: dict, alone: dict, passing, others: dict) -> None:
    """Results by test id of a check with batches and one without: the same verdict,
    message, error class and max_abs for every test, `passing` PASS alone and `others`
    (id -> verdict) what they are alone."""
    assert set(batched) == set(alone) == set(passing) | set(others)
    for test_id, a in alone.items():
        b = batched[test_id]
        assert b.verdict is a.verdict, (test_id, b.message, a.message)
        assert b.message == a.message, test_id
        assert b.error_class == a.error_class, test_id
        assert (b.metrics and b.metrics.max_abs) == (a.metrics and a.metrics.max_abs), test_id
    for test_id in passing:
        assert alone[test_id].verdict.value == "PASS", alone[test_id].message
    for test_id, verdict in others.items():
        assert alone[test_id].verdict is verdict, alone[test_id].message
