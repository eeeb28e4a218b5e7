"""Workers under another interpreter (`check --python`) and `opdiff upgrade`, with a real
environment that holds another onnxruntime: built once per test session from the package
registry (skipped with the reason when the registry has no such version or cannot be
reached), then reused by every test here, as a second `upgrade` reuses it."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
from helpers.cli import MODULE, run
from helpers.record import record_here
from packaging.version import Version

from opdiff_snap import api
from opdiff_snap.core.config import Settings
from opdiff_snap.execution.workerenvs import ensure_environment, parse_with, requirements_for
from opdiff_snap.history.runs import read_run

PYTHON = sys.executable
FAST = ["--repeats", "3", "--warmup", "1", "-j", "2"]
SUITE = """\
defaults: {seeds: 1}
dims: {B: 4, N: 16}
presets:
  x: {type: tensor, shape: [B, N], dtype: float32, init: normal}
  y: {type: tensor, shape: [B, N], dtype: float32, init: normal}
tests:
  - {id: exp, op: aten::exp.default, in: [{ref: x}]}
  - {id: add, op: aten::add.Tensor, in: [{ref: x}, {ref: y}]}
  - {id: relu, op: aten::relu.default, in: [{ref: x}]}
  - {id: tanh, op: aten::tanh.default, in: [{ref: x}]}
"""


def opdiff(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run(cwd, *args, entry=MODULE, env={**os.environ, "COLUMNS": "200"}, timeout=600)


def no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr


def run_files(root: Path) -> list[Path]:
    """The run files in the order the runs started (their ids say only the second)."""
    def started(path: Path) -> str:
        with path.open() as f:
            return json.loads(f.readline())["started"]

    return sorted((root / "store" / "runs").glob("*.jsonl"), key=started)


def other_onnxruntime() -> str:
    """The newest onnxruntime 1.30.x the registry offers (the installed one is 1.31.x)."""
    here = metadata.version("onnxruntime")
    if here.startswith("1.30."):
        pytest.skip(f"onnxruntime {here} is installed here; this test compares 1.30.x with another version")
    try:
        out = subprocess.run([PYTHON, "-m", "pip", "index", "versions", "onnxruntime"], capture_output=True,
                             text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.skip("the package registry did not answer `pip index versions onnxruntime` within 60 s")
    # the 1.30.x versions it names, however pip words and lays out its listing
    found = set(re.findall(r"(?<![\w.])1\.30\.\d+(?![\w.])", out.stdout))
    if not found:
        pytest.skip("the package registry cannot be reached or offers no onnxruntime 1.30.x "
                    f"(pip index versions: {(out.stdout + out.stderr).strip()[:300]})")
    return max(found, key=Version)


@pytest.fixture(scope="session")
def project(tmp_path_factory):
    """A tiny suite recorded on torch_cpu_fp32, with a cache folder for environments."""
    root = tmp_path_factory.mktemp("upgrade")
    assert record_here(root, SUITE).counts() == {"RECORDED": 4}
    return root


@pytest.fixture(scope="session")
def ort_env(project):
    """The environment `opdiff upgrade --with onnxruntime==1.30.x -b onnx_cpu_fp32` builds:
    built here once (the slow part), found again by the CLI through its requirement set."""
    version = other_onnxruntime()
    named = parse_with([f"onnxruntime=={version}"])
    env = ensure_environment(requirements_for(named, ["onnx"]), project / ".opdiff-cache", withs=named)
    print(f"\nupgrade environment: {env.installer}, {env.seconds:.1f} s, reused={env.reused}")
    return version, env


def pair_key(item):
    return (item["id"], item["seed"], item["preset"])


def direct_diff(path_a: Path, path_b: Path, drift_factor=10.0, threshold=0.25, spread_k=3.0) -> dict:
    """diff-runs computed by hand from two run files."""
    a = {pair_key(i): i for i in read_run(path_a).items}
    b = {pair_key(i): i for i in read_run(path_b).items}
    both = sorted(a.keys() & b.keys())

    def iqr(xs):
        if len(xs) < 2:
            return 0.0
        q = statistics.quantiles(xs, n=4, method="inclusive")
        return q[2] - q[0]

    latency = []
    for k in both:
        xa, xb = a[k]["infer_ms_all"], b[k]["infer_ms_all"]
        ma, mb = statistics.median(xa), statistics.median(xb)
        if abs(mb - ma) > max(threshold * ma, spread_k * max(iqr(xa), iqr(xb))):
            latency.append(list(k))
    drift = [list(k) for k in both if b[k]["metrics"] and a[k]["metrics"] is not None
             and b[k]["metrics"]["max_abs"] > drift_factor * max(a[k]["metrics"]["max_abs"], a[k]["tolerance"]["atol"])]
    return {"newly failing": sorted([list(k) for k in both if a[k]["status"] == "PASS" != b[k]["status"]]),
            "newly passing": sorted([list(k) for k in both if a[k]["status"] != "PASS" == b[k]["status"]]),
            "metric drift": sorted(drift), "latency changes": sorted(latency),
            "statuses": sorted((*k, a[k]["status"], b[k]["status"]) for k in both)}


@pytest.mark.slow
@pytest.mark.timeout(1800)   # pytest-timeout counts the session fixture's environment build (minutes on a busy box)
def test_python_then_upgrade_hold_both_versions_and_diff_runs_matches_the_jsonl(project, ort_env):
    version, env = ort_env
    here = metadata.version("onnxruntime")

    # --python: the workers run under the other environment; the parent writes the history
    proc = opdiff(project, "check", "-b", "onnx_cpu_fp32", "--python", str(env.python), *FAST)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"workers run under {env.python}" in proc.stdout and f"onnxruntime {version}" in proc.stdout
    first = read_run(run_files(project)[-1])
    assert first.complete and first.end["counts"] == {"PASS": 4}
    assert first.meta["env"]["onnxruntime"] == version and first.meta["env"]["executable"] == str(env.python)
    assert first.meta["settings"]["python"] == str(env.python)
    assert {i["cache_hit"] for i in first.items} == {False}

    # upgrade: the same environment (found by its requirement set), its artifacts cached by
    # the --python check, and a check here
    proc = opdiff(project, "upgrade", "--with", f"onnxruntime=={version}", "-b", "onnx_cpu_fp32", *FAST,
                  "--rounds", "1", "--format", "json")
    no_traceback(proc)
    said = proc.stdout + proc.stderr     # (with --format json the progress goes to stderr)
    assert proc.returncode == 0, said
    assert f"reusing the environment {env.root}" in said
    assert "== check here" in said and "reusing run" not in said
    files = run_files(project)
    there, here_run = read_run(files[-2]), read_run(files[-1])
    assert there.meta["env"]["onnxruntime"] == version and here_run.meta["env"]["onnxruntime"] == here
    assert here_run.meta["env"]["executable"] == PYTHON
    assert {i["cache_hit"] for i in there.items} == {True}   # exported by the --python check
    assert there.meta["plan"]["items"] == here_run.meta["plan"]["items"]

    # the history holds both versions; diff-runs --by onnxruntime picks the latest run of each
    # and reports what the two files say
    runs = api.query("SELECT onnxruntime, count(*) FROM runs WHERE command = 'check' GROUP BY ALL ORDER BY 1",
                     Settings(store=project / "store"))
    assert runs.rows == sorted([(version, 2), (here, 1)])
    proc = opdiff(project, "diff-runs", "--by", "onnxruntime", "--format", "json")
    no_traceback(proc)
    decoder, text, tables = json.JSONDecoder(), proc.stdout, []
    while text.lstrip().startswith("["):   # one JSON table per section, in diff-runs' order
        table, end = decoder.raw_decode(text.lstrip())
        tables.append(table)
        text = text.lstrip()[end:]
    printed = dict(zip(["environment differences", "newly failing", "newly passing", "metric drift",
                        "latency changes", "delegation changes"], tables))
    assert len(tables) == 7, proc.stdout
    assert printed["delegation changes"] == []   # onnxruntime delegates nothing
    expected = direct_diff(files[-2], files[-1])      # older version first: 1.30.x -> 1.31.x
    for section in ("newly failing", "newly passing", "metric drift", "latency changes"):
        got = sorted([r["test_id"], r["seed"], r["preset"]] for r in printed[section])
        assert got == expected[section], section
    env_rows = {r["field"]: (r["a"], r["b"]) for r in printed["environment differences"]}
    assert env_rows["onnxruntime"] == (version, here)
    assert env_rows["executable"] == (str(env.python), PYTHON)
    assert proc.returncode == (1 if expected["newly failing"] else 0)
    assert f"onnxruntime {version} ({there.meta['run_id']}) -> onnxruntime {here} ({here_run.meta['run_id']})" \
        in proc.stdout

    # the second upgrade with the same requirements: environment and artifacts reused, and
    # the check here is not repeated (a fresh run of the same plan exists)
    proc = opdiff(project, "upgrade", "--with", f"onnxruntime=={version}", "-b", "onnx_cpu_fp32", *FAST,
                  "--rounds", "1", "--html", "up.html")
    no_traceback(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"reusing the environment {env.root}" in proc.stdout
    assert f"reusing run {here_run.meta['run_id']}" in proc.stdout
    again = read_run(run_files(project)[-1])
    assert again.meta["env"]["onnxruntime"] == version and {i["cache_hit"] for i in again.items} == {True}
    assert f"onnxruntime {here} (here, {here_run.meta['run_id']}) -> onnxruntime {version}" in proc.stdout
    page = (project / "up.html").read_text()
    assert "Latency ratio per op family" in page and 'src="data:image/png;base64,' in page


def test_worker_environment_without_opdiff_snap(project, tmp_path):
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    before = run_files(project)
    proc = opdiff(project, "check", "-b", "onnx_cpu_fp32", "--python", str(tmp_path / "bare" / "bin" / "python"))
    no_traceback(proc)
    assert proc.returncode == 2
    bare = tmp_path / "bare" / "bin" / "python"
    assert f"{bare} has no opdiff-snap" in proc.stderr
    assert f"{bare} -m pip install -e" in proc.stderr and "nothing was run" in proc.stderr
    assert run_files(project) == before and proc.stdout == ""

    # opdiff-snap found there (a .pth to this checkout) but not its dependencies: the import
    # error (the first missing package, whichever the worker imports first) and the install
    # command with the extras
    import opdiff_snap

    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(tmp_path / "notorch")], check=True)
    site = next((tmp_path / "notorch" / "lib").glob("python*/site-packages"))
    (site / "checkout.pth").write_text(str(Path(opdiff_snap.__file__).resolve().parent.parent) + "\n")
    proc = opdiff(project, "check", "-b", "onnx_cpu_fp32", "--python", str(tmp_path / "notorch"))
    no_traceback(proc)
    assert proc.returncode == 2
    assert "cannot start a worker: ModuleNotFoundError" in proc.stderr
    assert "[onnx]'` (the extras of the presets you check)" in proc.stderr
    assert run_files(project) == before


def test_broken_interpreter_paths(project, tmp_path):
    before = run_files(project)
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    (tmp_path / "text").write_text("not a program\n")
    (tmp_path / "text").chmod(0o755)
    cases = {str(tmp_path / "missing" / "python"): "no such interpreter",
             str(tmp_path / "gone"): "a link whose target is gone",
             str(tmp_path / "text"): "cannot run it",
             str(tmp_path): "a folder with no bin/python",
             "/bin/false": "exited with code 1 before it could say which opdiff-snap it runs"}
    for path, said in cases.items():
        proc = opdiff(project, "check", "-b", "onnx_cpu_fp32", "--python", path)
        no_traceback(proc)
        assert proc.returncode == 2, (path, proc.stderr)
        assert said in proc.stderr and path in proc.stderr, (path, proc.stderr)
    assert run_files(project) == before


def test_older_worker_protocol_is_refused_with_the_install_command(project, tmp_path):
    """An environment whose opdiff-snap speaks another worker protocol (as an older release
    would): its worker says hello, and the parent refuses before any job."""
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(tmp_path / "old")], check=True)
    site = next((tmp_path / "old" / "lib").glob("python*/site-packages"))
    pkg = site / "opdiff_snap" / "execution"
    pkg.mkdir(parents=True)
    (site / "opdiff_snap" / "__init__.py").write_text('__version__ = "0.0.9"\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "pool.py").write_text(textwrap.dedent('''
        import json, sys
        WORKER_PROTOCOL = 0
        def serve(conn, threads, log):
            conn.send_bytes(b"hello " + json.dumps({"protocol": 0, "opdiff_snap": "0.0.9",
                                                    "location": __file__, "env": {}}).encode())
            conn.recv_bytes()
    '''))
    before = run_files(project)
    python = tmp_path / "old" / "bin" / "python"
    proc = opdiff(project, "check", "-b", "onnx_cpu_fp32", "--python", str(python))
    no_traceback(proc)
    assert proc.returncode == 2
    assert f"{python} has opdiff-snap 0.0.9" in proc.stderr and "speak protocol none (too old)" in proc.stderr
    assert f"{python} -m pip install -e" in proc.stderr
    assert run_files(project) == before


@pytest.mark.slow
def test_unsatisfiable_with_is_one_paragraph_and_leaves_nothing(project, tmp_path):
    before = run_files(project)
    cache = tmp_path / "cache"
    proc = opdiff(project, "--cache", str(cache), "upgrade", "--with", "onnxruntime==0.0.1", "-b", "onnx_cpu_fp32")
    no_traceback(proc)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = proc.stderr.strip()
    assert error.startswith("opdiff: error: cannot build an environment with onnxruntime==0.0.1")
    assert "onnxruntime==0.0.1" in error and "name a version that exists" in error and "\n" not in error
    assert "  | building an environment with" in proc.stdout            # progress was shown
    assert run_files(project) == before
    envs = cache / "envs"
    assert [p.suffix for p in envs.iterdir()] == [".log"]               # no half-built environment


def test_with_must_be_an_exact_pin(project, tmp_path):
    for bad in ("onnxruntime", "onnxruntime>=1.30", "onnxruntime==", "opdiff-snap==0.1.0"):
        proc = opdiff(project, "--cache", str(tmp_path), "upgrade", "--with", bad, "-b", "onnx_cpu_fp32")
        no_traceback(proc)
        assert proc.returncode == 2 and f"--with '{bad}'" in proc.stderr, proc.stderr
        assert proc.stdout == ""
    assert list(tmp_path.iterdir()) == []     # refused before anything was built


PIP_CONFLICT = """\
INFO: pip is looking at multiple versions of executorch to determine which version is compatible with other requirements. This could take a while.
ERROR: Cannot install -r /c/envs/b0c0/requirements.txt (line 2) because these package versions have conflicting dependencies.

The conflict is caused by:
    executorch 1.0.0 depends on coremltools==9.0b1; platform_system == "Darwin" or platform_system == "Linux"
    The user requested (constraint) coremltools==9.0

To fix this you could try to:
1. loosen the range of package versions you've specified
2. remove package versions to allow pip attempt to solve the dependency conflict

ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/en/latest/topics/dependency-resolution/
"""


def test_a_conflict_is_named_with_the_pin_that_resolves_it(tmp_path):
    """pip's words (as it printed them here for `upgrade --with executorch==1.0.0`) become one
    paragraph naming both sides and the --with to add."""
    from opdiff_snap.execution.workerenvs import Requirements, _failure_message

    text = _failure_message(Requirements(("-e .", "executorch==1.0.0"), (), "3.11"),
                            parse_with(["executorch==1.0.0"]), "pip", PIP_CONFLICT,
                            tmp_path / "k" / "install.log")
    assert "pip says: executorch 1.0.0 depends on coremltools==9.0b1; The user requested (constraint) " \
           "coremltools==9.0." in text
    assert "--with coremltools==9.0b1" in text and "\n" not in text and "loosen" not in text
