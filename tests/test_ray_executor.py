"""The Ray executor on a real Ray cluster started by these tests (`ray start` on loopback):
a head node, and a second node that advertises the custom resource `special`. Hardware
routing, CRASH / TIMEOUT isolation, an actor and a node dying mid-run, and a Ray run's
history agreeing item by item with a local run's. The cluster is shared by the module;
the test that kills a node adds its own node first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.check import cli_env, make_site, opdiff, opdiff_popen, plugin_installed
from helpers.cli import MODULE, run
from helpers.execution.cases import job, module_case, op_case, x
from helpers.hostile.processes import gone_within, kill_leftovers, unique_sleep, with_argument
from helpers.ray import AUTH, ENTRY_POINTS, Cluster

from opdiff_snap.backends.registry import all_presets, get_preset, requirements
from opdiff_snap.core.config import parse_executor
from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.core.verdicts import Verdict
from opdiff_snap.execution.outputs import restore_outputs
from opdiff_snap.history.runs import read_run

HERE = Path(__file__).resolve().parent
FAST = ["--repeats", "1", "--warmup", "0"]
TIMING = {"ts", "run_id", "export_ms", "load_ms", "infer_ms", "infer_ms_all", "times_all"}


# ---------------------------------------------------------------- without a cluster

def test_importing_the_cli_and_api_imports_no_ray():
    code = ("import sys, opdiff_snap.cli, opdiff_snap.api, opdiff_snap.run.session; "
            "assert 'ray' not in sys.modules, 'ray was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_executor_spec_and_preset_hardware():
    assert parse_executor("local") == ("local", None)
    assert parse_executor("ray") == ("ray", None)
    assert parse_executor("ray://10.1.2.3:6379") == ("ray", "10.1.2.3:6379")
    assert parse_executor("ray://auto") == ("ray", "auto")
    for bad in ("ray:/h:1", "ray://host", "dask", "ray://:6379", ""):
        with pytest.raises(OpdiffError, match="ray://HOST:PORT"):
            parse_executor(bad)
    needs = {p.name: requirements(p) for p in all_presets()}
    assert needs["onnx_cpu_fp32"] == needs["executorch_portable_fp32"] == frozenset()
    assert needs["torch_cuda_fp16"] == needs["onnx_cuda_fp32"] == needs["inductor_cuda_bf16"] == {"cuda"}
    assert needs["coreml_any_fp16"] == needs["onnx_coreml_fp32"] == needs["executorch_coreml_fp16"] == {"macos"}
    assert needs["torch_mps_fp32"] == needs["executorch_mps_fp16"] == {"macos", "apple_silicon"}


def test_a_bad_executor_flag_is_a_usage_error(tmp_path):
    proc = run(tmp_path, "check", "-b", "torch_cpu_fp32", "--executor", "ray:/nohost", entry=MODULE, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("opdiff: error: --executor: "), proc.stderr
    assert "ray://HOST:PORT" in proc.stderr and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "Traceback" not in proc.stderr


NOT_HERE = "OPDIFF_TEST_NOT_HERE"   # helpers/ray/where.py refuses to import where it is set


def where_project(root: Path, site: Path) -> Path:
    """A project with helpers/ray/where.yaml and its golden (recorded here, in this process)."""
    (root / "suites").mkdir(parents=True)
    for name in ("where.py", "where.yaml"):
        shutil.copy(HERE / "helpers" / "ray" / name, root / "suites" / name)
    proc = opdiff(root, site, "record", *FAST, "--in-process")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def opdiff_not_here(cwd: Path, site: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI with where.py unimportable in its own process and its local workers. The
    suites are named by absolute path: a node finds a suite's `file:` modules from the
    suite's path as given, and the nodes run in another working directory."""
    return run(cwd, "--suites", str(cwd / "suites"), *args, entry=MODULE, env={**cli_env(site), NOT_HERE: "1"},
               timeout=300)


def one_paragraph_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("opdiff: error: "), proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


@pytest.mark.slow
def test_validate_localize_and_gradcheck_refuse_local_only_flags_with_ray(site, where):
    """--in-process and --python are for local workers: with --executor ray, validate,
    localize and gradcheck refuse them the way check does, before any Ray starts."""
    root = where
    python = ["--python", sys.executable, "--executor", "ray"]
    both = "--executor ray on a Ray cluster's own interpreters; give one of them."
    one_paragraph_error(opdiff(root, site, "validate", "--imports", *python), "--python runs workers here", both)
    one_paragraph_error(opdiff(root, site, "gradcheck", *python), "--python runs workers here", both)
    one_paragraph_error(opdiff(root, site, "localize", "cube", "-b", "torch_cpu_fp32", *python),
                        "--python runs workers here", both)
    one_paragraph_error(opdiff(root, site, "localize", "cube", "-b", "torch_cpu_fp32", "--in-process",
                               "--executor", "ray"), "--in-process runs jobs in this process", both)


@pytest.mark.slow
def test_validate_localize_and_gradcheck_run_their_workers_under_python(site, where, tmp_path):
    """--python reaches the pool of validate, localize and gradcheck: an interpreter without
    opdiff-snap is refused before anything runs, as check refuses it."""
    root = where
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = tmp_path / "bare" / "bin" / "python"
    for args in (["validate", "--imports"], ["gradcheck"], ["localize", "cube", "-b", "torch_cpu_fp32"]):
        one_paragraph_error(opdiff(root, site, *args, "--python", str(bare)), f"{bare} has no opdiff-snap")


# ---------------------------------------------------------------- the cluster

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return make_site(tmp_path_factory.mktemp("raysite"), ENTRY_POINTS, name="opdiff-ray-test")


@pytest.fixture(scope="module")
def cluster(site):
    """Head (1 CPU) + a node advertising `special` (1 CPU); this process joins as a driver
    (with the cluster's token in its environment, which the CLI runs inherit)."""
    saved = {k: os.environ.get(k) for k in AUTH}
    os.environ.update(AUTH)   # before ray reads its configuration
    ray = pytest.importorskip("ray")
    c = Cluster(cli_env(site))
    try:
        c.start_head()
        c.add_node("special", {"special": 1})
        ray.init(address=c.address, log_to_driver=False, logging_level="ERROR")
        c.wait_for(ray, 2)
        with plugin_installed(site):
            yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("rayproj")
    (root / "suites").mkdir()
    shutil.copy(HERE / "helpers" / "ray" / "suite.yaml", root / "suites" / "suite.yaml")
    return root


def relu_outcome_ok(outcome, seed):
    assert outcome.status is None, outcome.error_message
    torch.testing.assert_close(restore_outputs(outcome.output_structure, outcome.outputs), x(4, seed=seed).relu())


@pytest.mark.slow
def test_routing_and_isolation_on_the_cluster(cluster):
    """Jobs of a preset needing `special` run only on the node advertising it; a segfault
    is CRASH with the signal, a hang TIMEOUT, a preset no node can run UNAVAILABLE at once;
    every task yields exactly one result."""
    import ray

    from opdiff_snap.execution.ray_pool import RayPool

    special = get_preset("special_cpu_fp32")
    jobs = [job(op_case("aten::relu", id=f"s{i}"), [x(4, seed=i)], preset=special, key=f"s{i}") for i in range(3)]
    jobs += [job(op_case("aten::relu", id=f"c{i}"), [x(4, seed=i)], key=f"c{i}") for i in range(3)]
    jobs += [job(module_case("file:crashy.py::Segfault", id="segv"), [x(3)], key="segv"),
             job(module_case("file:crashy.py::Hang", id="hang"), [x(3)], key="hang"),
             job(op_case("aten::relu", id="nowhere"), [x(4)], preset=get_preset("nowhere_cpu_fp32"), key="nowhere")]
    started = time.monotonic()
    with RayPool(cluster.address, timeout_s=8) as pool:
        outcomes = list(pool.run(jobs))
    assert time.monotonic() - started < 150
    assert sorted(o.key for o in outcomes) == sorted(j.key for j in jobs)   # exactly one each
    by_key = {o.key: o for o in outcomes}
    special_node = cluster.node_id(ray, "special")
    for i in range(3):
        relu_outcome_ok(by_key[f"s{i}"], i)
        assert by_key[f"s{i}"].worker_node == special_node
        relu_outcome_ok(by_key[f"c{i}"], i)
    assert {o.worker_node for o in outcomes} - {None} <= {n["NodeID"] for n in ray.nodes()}
    seg = by_key["segv"]
    assert seg.status is Verdict.CRASH and seg.error_class == "signal SIGSEGV"
    assert "about to read address 0" in seg.error_message   # the worker's own last words
    assert by_key["hang"].status is Verdict.TIMEOUT and "no result after 8 s" in by_key["hang"].error_message
    nowhere = by_key["nowhere"]
    assert nowhere.status is Verdict.UNAVAILABLE and nowhere.worker_node is None
    assert "advertises nowhere" in nowhere.error_message and """--resources '{"nowhere": 1}'""" in nowhere.error_message


@pytest.mark.slow
def test_jobs_queued_behind_a_hang_on_a_one_slot_node_still_run(cluster):
    """The one-slot `special` node's actor gets its next job while it runs the current one;
    when the current one hangs past the timeout, the jobs queued behind it still run and
    pass, and each job yields exactly one result."""
    from opdiff_snap.execution.ray_pool import RayPool

    special = get_preset("special_cpu_fp32")
    jobs = [job(module_case("file:crashy.py::Hang", id="hang"), [x(3)], preset=special, key="hang")]
    jobs += [job(op_case("aten::relu", id=f"s{i}"), [x(4, seed=i)], preset=special, key=f"s{i}") for i in range(2)]
    with RayPool(cluster.address, timeout_s=8) as pool:
        outcomes = list(pool.run(jobs))
    assert sorted(o.key for o in outcomes) == ["hang", "s0", "s1"]
    by_key = {o.key: o for o in outcomes}
    assert by_key["hang"].status is Verdict.TIMEOUT
    for i in range(2):
        relu_outcome_ok(by_key[f"s{i}"], i)


@pytest.mark.slow
def test_a_job_whose_worker_dies_is_retried_elsewhere(cluster):
    """An actor killed while it runs a job (its process gone, as when a node fails): the job
    runs again on another worker, and the run yields its one result."""
    import ray

    from opdiff_snap.execution.ray_pool import RayPool

    sleepy = get_preset("sleepy_cpu_fp32", {"sleep_s": 1.5})
    jobs = [job(op_case("aten::relu", id=f"r{i}"), [x(4, seed=i)], preset=sleepy, key=f"r{i}", repeats=1, warmup=0)
            for i in range(4)]
    notes: list[str] = []
    with RayPool(cluster.address, timeout_s=60, notify=notes.append) as pool:
        results = pool.run(jobs)
        first = next(results)
        victim = next(a for a in pool._actors if a.busy)
        ray.kill(victim.handle, no_restart=True)
        outcomes = [first, *results]
    assert sorted(o.key for o in outcomes) == [f"r{i}" for i in range(4)]
    for o in outcomes:
        relu_outcome_ok(o, int(o.key[1:]))
    assert len(notes) == 1 and "lost its Ray worker" in notes[0] and "retried elsewhere" in notes[0]


@pytest.mark.slow
def test_a_killed_actor_leaves_neither_its_worker_nor_what_the_job_started(cluster):
    """An actor killed while its worker runs a job that started a process and hangs: the
    worker notices its parent is gone and ends its process group; the retry elsewhere times
    out, and its worker's group is ended too. Nothing with the job's `sleep` is left."""
    import threading

    import ray

    from opdiff_snap.execution.ray_pool import RayPool

    arg = unique_sleep()
    jobs = [job(module_case("file:crashy.py::SpawnAndHang", arg, id="spawn"), [x(3)], key="spawn")]
    killed: list[str] = []
    try:
        with RayPool(cluster.address, timeout_s=6) as pool:
            def kill_first_actor() -> None:
                deadline = time.monotonic() + 120
                while not with_argument(arg) and time.monotonic() < deadline:
                    time.sleep(0.1)
                actor = next(a for a in pool._actors if a.busy)
                killed.append(actor.node.id)
                ray.kill(actor.handle, no_restart=True)

            killer = threading.Thread(target=kill_first_actor, daemon=True)
            killer.start()
            [outcome] = list(pool.run(jobs))
            killer.join(5)
        assert killed, "the job never started"
        assert outcome.status is Verdict.TIMEOUT, outcome.error_message   # the retry, on its timeout
        assert gone_within(arg, []) == ([], [])
    finally:
        kill_leftovers(arg)


def items_by_key(run) -> dict:
    out = {}
    for item in run.items:
        key = (item["id"], item["seed"], item["preset"])
        assert key not in out, f"{key} written twice"
        out[key] = item
    return out


def without_timings(item: dict) -> dict:
    out = {k: v for k, v in item.items() if k not in TIMING}
    out["backends"] = [{"name": b["name"], "res": {k: v for k, v in b["res"].items() if k not in TIMING}}
                       for b in item["backends"]]
    return out


def latest_run(root: Path):
    return read_run(sorted((root / "store" / "runs").glob("*.jsonl"))[-1])


@pytest.mark.slow
def test_record_and_check_on_ray_agree_with_a_local_run(cluster, site, project):
    """Record on a Ray instance the CLI starts itself (`--executor ray`); check on the cluster
    and locally: the two check runs' items agree apart from timings."""
    proc = opdiff(project, site, "record", *FAST, "-j", "2", "--executor", "ray")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recorded = latest_run(project)
    assert {i["status"] for i in recorded.items} == {"RECORDED"} and len(recorded.items) == 11
    assert recorded.meta["settings"]["executor"] == "ray"
    assert [n["resources"]["CPU"] for n in recorded.meta["settings"]["nodes"]] == [2.0]

    ray_flag = ["--executor", f"ray://{cluster.address}"]

    presets = ["-b", "torch_cpu_fp32", "-b", "special_cpu_fp32", *FAST]
    local = opdiff(project, site, "check", *presets)
    assert local.returncode == 0, local.stdout + local.stderr
    local_run = latest_run(project)
    on_ray = opdiff(project, site, "check", *presets, *ray_flag)
    assert on_ray.returncode == 0, on_ray.stdout + on_ray.stderr
    ray_run = latest_run(project)
    assert ray_run.path != local_run.path and ray_run.end is not None

    local_items, ray_items = items_by_key(local_run), items_by_key(ray_run)
    assert len(local_items) == 22 and {i["status"] for i in local_items.values()} == {"PASS"}
    assert local_items.keys() == ray_items.keys()
    for key in local_items:
        assert without_timings(ray_items[key]) == without_timings(local_items[key]), key
    nodes = ray_run.meta["settings"]["nodes"]
    assert len(nodes) == 2 and sum(1 for n in nodes if n["resources"].get("special")) == 1
    assert "executor" not in local_run.meta["settings"]


@pytest.mark.slow
def test_a_node_that_dies_mid_run_loses_no_item(cluster, site, project):
    """A third node (advertising `doomed`) is killed, process group and all, while the run
    uses it: jobs it was running that another node can take run again there; those only it
    could run are CRASH naming it (the one it was running, and those queued for it, which
    say it died); every item is written once, the run ends and it fails."""
    import ray

    if not (project / "goldens").exists():
        assert opdiff(project, site, "record", *FAST).returncode == 0
    cluster.add_node("doomed", {"doomed": 1})
    cluster.wait_for(ray, 3)
    doomed_label = cluster.node_id(ray, "doomed")[:12]
    runs = project / "store" / "runs"
    before = set(runs.glob("*.jsonl"))
    proc = opdiff_popen(project, site, "check", "-b", "sleepy_cpu_fp32", "-b", "doomed_cpu_fp32", *FAST,
                        "--preset-options", 'sleepy_cpu_fp32={"sleep_s": 1.0}',
                        "--preset-options", 'doomed_cpu_fp32={"sleep_s": 1.0}',
                        "--executor", f"ray://{cluster.address}")
    deadline = time.monotonic() + 180
    while True:
        assert time.monotonic() < deadline and proc.poll() is None, "the run ended before the node was killed"
        new = [p for p in runs.glob("*.jsonl") if p not in before]
        if new and sum('"doomed_cpu_fp32"' in line and '"PASS"' in line
                       for line in new[0].read_text().splitlines()) >= 2:
            break
        time.sleep(0.1)
    cluster.kill("doomed")
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in err
    run = read_run(new[0])
    assert run.end is not None
    items = items_by_key(run)
    assert len(items) == 22
    sleepy = [i for k, i in items.items() if k[2] == "sleepy_cpu_fp32"]
    assert {i["status"] for i in sleepy} == {"PASS"}
    doomed = [i for k, i in items.items() if k[2] == "doomed_cpu_fp32"]
    passed = [i for i in doomed if i["status"] == "PASS"]
    crashed = [i for i in doomed if i["status"] == "CRASH" and "died while running the job" in i["error_message"]]
    stranded = [i for i in doomed if i["status"] == "CRASH" and i not in crashed]
    assert not [i for i in doomed if i["status"] == "UNAVAILABLE"], "a lost node is not a quiet UNAVAILABLE"
    assert len(passed) >= 2 and len(passed) + len(crashed) + len(stranded) == 11 and len(crashed) <= 1
    assert stranded, "the items queued for the dead node must be reported"
    assert proc.returncode == 1, out + err   # a node lost mid-run fails the run
    for i in crashed:
        assert doomed_label in i["error_message"] and "died while running the job" in i["error_message"]
    for i in stranded:
        assert "advertises doomed" in i["error_message"] and doomed_label in i["error_message"]
        assert "died during the run" in i["error_message"] and i["error_class"] == "NodeDied"
    # whatever the node was running: a CRASH naming it, or a job retried elsewhere
    assert crashed or ("retried elsewhere" in out and doomed_label in out)


@pytest.fixture(scope="module")
def where(tmp_path_factory, site):
    return where_project(tmp_path_factory.mktemp("raywhere"), site)


@pytest.mark.slow
def test_validate_imports_on_the_cluster(cluster, site, where):
    """validate --imports probes the suite's code in the executor's workers: on the cluster's
    nodes with --executor, in local workers without."""
    local = opdiff_not_here(where, site, "validate", "--imports")
    assert local.returncode == 2 and "not on a Ray node" in local.stderr, local.stdout + local.stderr
    on_ray = opdiff_not_here(where, site, "validate", "--imports", "--executor", f"ray://{cluster.address}")
    assert on_ray.returncode == 0 and "ok: 1 tests" in on_ray.stdout, on_ray.stdout + on_ray.stderr


@pytest.mark.slow
def test_gradcheck_on_the_cluster(cluster, site, where):
    local = opdiff_not_here(where, site, "gradcheck")
    assert local.returncode == 1 and "not on a Ray node" in local.stdout, local.stdout + local.stderr
    on_ray = opdiff_not_here(where, site, "gradcheck", "--executor", f"ray://{cluster.address}")
    assert on_ray.returncode == 0, on_ray.stdout + on_ray.stderr
    assert "1 of 1 tests pass gradcheck" in on_ray.stdout


@pytest.mark.slow
def test_localize_on_the_cluster(cluster, site, where):
    """localize runs every piece on the cluster (those of a preset needing `special` on the
    node advertising it); a preset no node can run is refused before anything runs, naming
    what is missing."""
    local = opdiff_not_here(where, site, "localize", "cube", "-b", "special_cpu_fp32")
    assert local.returncode == 2 and "not on a Ray node" in local.stderr, local.stdout + local.stderr
    ray_flag = ["--executor", f"ray://{cluster.address}"]
    on_ray = opdiff_not_here(where, site, "localize", "cube", "-b", "special_cpu_fp32", *ray_flag)
    assert on_ray.returncode == 0, on_ray.stdout + on_ray.stderr
    assert "reproduce the baseline within tolerance" in on_ray.stdout
    nowhere = opdiff_not_here(where, site, "localize", "cube", "-b", "nowhere_cpu_fp32", *ray_flag)
    one_paragraph_error(nowhere, "localize needs to run preset 'nowhere_cpu_fp32'", "advertises nowhere",
                        """--resources '{"nowhere": 1}'""")
