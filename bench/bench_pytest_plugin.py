"""The pytest plugin: the shipped suites' warm re-check through pytest against `opdiff
check`, and what the dormant plugin costs a session that does not use it.

    python bench/bench_pytest_plugin.py [-b onnx_cpu_fp32] [-j 2] [--reps 2] [--xdist]
    python bench/bench_pytest_plugin.py --dormant-only
    python bench/bench_pytest_plugin.py --suite models.yaml --skip-dormant   # one suite file only

Both checks run in a scratch project whose suites/ and goldens/ are links to this
repository's, with the artifact cache `--cache` (default ./.opdiff-cache) shared and
filled by one unmeasured check first, so both measured runs are warm; their histories go
to the scratch project's store/. Runs alternate (check, pytest, check, pytest, ...) and
the median of each is reported, with the 1-minute load average before each run.
`--xdist` adds `pytest -n 2` (one worker process per xdist worker). `--only-this-plugin` adds
`pytest --opdiff` with every other installed pytest plugin left out
(PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 -p opdiff_snap.pytest_plugin): what the plugin costs, apart
from what the environment's other plugins cost every pytest session. `--suite FILE` makes the
scratch project of that one shipped suite file (and the folders beside it) and the goldens
of its tests only, for a run whose fixed costs weigh as they do on a small project.

The plugin is loaded through its pytest11 entry point; where the package was installed
before that entry point existed, a scratch *.dist-info registers it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, load, run_timed


def plugin_env(work: Path) -> dict[str, str]:
    env = dict(os.environ, COLUMNS="200")
    paths = [str(ROOT)]
    installed = any(ep.value == "opdiff_snap.pytest_plugin"
                    for ep in importlib.metadata.entry_points(group="pytest11"))
    if not installed:
        info = work / "site" / "opdiff_snap_plugin-0.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: opdiff-snap-plugin\nVersion: 0\n")
        (info / "entry_points.txt").write_text("[pytest11]\nopdiff = opdiff_snap.pytest_plugin\n")
        paths.append(str(work / "site"))
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_logged(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[float, float, str]:
    """The wall of `cmd`, the load before it and its output's last line; its output into `log`."""
    before = load()
    wall, proc = run_timed(cmd, cwd=cwd, env=env)
    log.write_text(proc.stdout + proc.stderr)
    tail = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()][-1:] or [""]
    return wall, before, tail[0]


def dormant(work: Path, env: dict[str, str], reps: int) -> None:
    """A trivial session with the plugin installed but not asked for, against one with it
    blocked (-p no:opdiff); and the import of the plugin module itself."""
    project = work / "dormant"
    project.mkdir()
    (project / "test_plain.py").write_text("def test_ok():\n    assert True\n")
    code = ("import time, pytest; t = time.perf_counter(); import opdiff_snap.pytest_plugin; "
            "print((time.perf_counter() - t) * 1e3)")
    imports = [float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    check=True).stdout) for _ in range(reps * 3)]
    heavy = subprocess.run([sys.executable, "-c", "import sys, pytest, opdiff_snap.pytest_plugin; "
                            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'numpy', 'zarr'))))"],
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    on, off = [], []
    for _ in range(reps * 3):
        on.append(run_logged(base, project, env, work / "dormant-on.log")[0])
        off.append(run_logged(base + ["-p", "no:opdiff"], project, env, work / "dormant-off.log")[0])
    print(f"import opdiff_snap.pytest_plugin (pytest already imported): median {statistics.median(imports):.1f} ms "
          f"over {len(imports)}; heavy modules it imports: {heavy}")
    print(f"trivial session, plugin installed, not asked: median {statistics.median(on):.2f} s; "
          f"blocked (-p no:opdiff): {statistics.median(off):.2f} s ({len(on)} runs each)")


def one_suite(project: Path, name: str) -> None:
    """suites/ with the one file (and the folders beside it, for its file: modules), and
    goldens/ with the goldens of that file's tests."""
    from opdiff_snap.goldens import GoldenStore
    from opdiff_snap.suite import load_suites

    suites = project / "suites"
    suites.mkdir()
    (suites / name).symlink_to(ROOT / "suites" / name)
    for entry in (ROOT / "suites").iterdir():
        if entry.is_dir():
            (suites / entry.name).symlink_to(entry)
    ids = {c.id for c in load_suites([ROOT / "suites" / name], check_names=False)}
    shipped, goldens = GoldenStore(ROOT / "goldens"), GoldenStore(project / "goldens")
    for info in shipped.index():
        if info.test_id in ids:
            goldens.write(shipped.read(info.test_id, info.seed))   # loose copies of packed goldens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-b", "--backend", default="onnx_cpu_fp32")
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="measured runs of each")
    ap.add_argument("--cache", type=Path, default=ROOT / ".opdiff-cache")
    ap.add_argument("--xdist", action="store_true", help="also pytest -n 2")
    ap.add_argument("--only-this-plugin", action="store_true",
                    help="also pytest --opdiff with plugin autoloading off and only this plugin loaded")
    ap.add_argument("--dormant-only", action="store_true")
    ap.add_argument("--skip-dormant", action="store_true")
    ap.add_argument("--suite", help="one file of suites/ (say models.yaml): only its tests and goldens")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="opdiff-bench-pytest-"))
    try:
        env = plugin_env(work)
        if not args.skip_dormant:
            dormant(work, env, args.reps)
        if args.dormant_only:
            return
        project = work / "project"
        project.mkdir()
        if args.suite:
            one_suite(project, args.suite)
        else:
            (project / "suites").symlink_to(ROOT / "suites")
            (project / "goldens").symlink_to(ROOT / "goldens")
        (project / "pyproject.toml").write_text(f'[tool.opdiff]\ncache = "{args.cache.resolve()}"\n')
        check = [sys.executable, "-m", "opdiff_snap.cli", "check", "-b", args.backend, "-j", str(args.jobs),
                 "--format", "json"]
        pytest_cmd = [sys.executable, "-m", "pytest", "--opdiff", "-b", args.backend, "--opdiff-jobs",
                      str(args.jobs), "-q", "-p", "no:cacheprovider"]
        variants = {"opdiff check": (check, env), "pytest --opdiff": (pytest_cmd, env)}
        if args.xdist:
            variants["pytest --opdiff -n 2"] = ([sys.executable, "-m", "pytest", "--opdiff", "-b", args.backend,
                                                 "-n", "2", "-q", "-p", "no:cacheprovider"], env)
        if args.only_this_plugin:
            variants["pytest --opdiff, no other plugin"] = (
                pytest_cmd + ["-p", "opdiff_snap.pytest_plugin"], dict(env, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1"))
        wall, _, _ = run_logged(check, project, env, work / "warmup.log")
        print(f"warm-up check (fills the cache where needed): {wall:.1f} s")
        walls: dict[str, list[tuple[float, float, str]]] = {k: [] for k in variants}
        for rep in range(args.reps):
            for name, (cmd, run_env) in variants.items():
                slug = re.sub(r"\W+", "_", name)
                walls[name].append(run_logged(cmd, project, run_env, work / f"{slug}-{rep}.log"))
        for name, runs in walls.items():
            shown = ", ".join(f"{w:.1f} s (load {ld:.2f})" for w, ld, _ in runs)
            print(f"{name:<22} median {statistics.median(w for w, _, _ in runs):7.1f} s   runs: {shown}")
            print(f"{'':<22} last line: {runs[-1][2][:150]}")
        check_median = statistics.median(w for w, _, _ in walls["opdiff check"])
        for name in [n for n in walls if n.startswith("pytest")]:
            ratio = statistics.median(w for w, _, _ in walls[name]) / check_median
            print(f"{name} / opdiff check: {ratio:.3f} (goal <= 1.1)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
