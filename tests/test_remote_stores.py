"""Goldens, history and the artifact cache behind s3:// URLs, end to end through the real
CLI against a real S3 server on loopback (moto's server mode, authentication on): record,
check, a shared cache, resume from the remote copy, query, verify, prune; the server dying
mid-record and mid-check; wrong credentials and a missing bucket."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers.cli import MODULE, run, start
from helpers.remote import MetadataService, Relay, S3Server
from helpers.tables import table_rows
from test_goldens_concurrency import WRITER, _check_whole

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]
FAST = ["--in-process", "--repeats", "1", "--warmup", "0"]

SUITE = """\
presets:
  x: {type: tensor, shape: [2, 4], dtype: float32, init: normal}
tests:
  - {id: add, op: aten::add.Tensor, in: [{ref: x}, {ref: x}]}
  - {id: relu, op: aten::relu.default, in: [{ref: x}]}
  - {id: exp, op: aten::exp.default, in: [{ref: x}]}
  - {id: lin, op: {type: module, path: torch.nn.Linear, args: [4, 3]}, in: [{ref: x}]}
"""

# each call sleeps SLOW_S seconds, so a run can be made slow enough to interrupt in the middle
SLOW_SUITE = """\
presets:
  x: {type: tensor, shape: [2, 4], dtype: float32, init: normal}
tests:
""" + "".join(f"  - {{id: slow{i}, op: {{type: module, path: 'file:slow.py::Slow', args: [{i}]}}, in: [{{ref: x}}]}}\n"
              for i in range(8))
SLOW_PY = """\
import os
import time
import torch


class Slow(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        self.k = float(k)

    def forward(self, x):
        time.sleep(float(os.environ.get("SLOW_S", "0.02")))
        return x * self.k
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = S3Server.start(tmp_path_factory.mktemp("moto") / "moto.log")
    yield s
    s.stop()


def project(root: Path, suite: str = SUITE, extra: dict[str, str] | None = None) -> Path:
    (root / "suites").mkdir(parents=True)
    (root / "suites" / "small.yaml").write_text(suite)
    for name, text in (extra or {}).items():
        (root / "suites" / name).write_text(text)
    return root


class Cli:
    """The real CLI in a subprocess, with one server's credentials; keeps every output."""

    def __init__(self, server: S3Server, home: Path, endpoint: str | None = None, **env: str):
        self.env = server.env(home, endpoint, **env)
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
        self.outputs: list[str] = []

    def __call__(self, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        p = run(cwd, *args, entry=MODULE, env=self.env, timeout=timeout)
        self.outputs += [p.stdout, p.stderr]
        return p

    def popen(self, cwd: Path, *args: str) -> subprocess.Popen:
        return start(cwd, *args, entry=MODULE, env=self.env, start_new_session=True)


def clean(p: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in p.stderr and "internal error" not in p.stderr, p.stderr


def report(p: subprocess.CompletedProcess) -> dict:
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


def resumable(runs_output: str) -> str:
    """The run `opdiff runs` lists as resumable (its first column)."""
    [run_id] = [row[0] for row in table_rows(runs_output) if any("resumable" in cell for cell in row)]
    return run_id


def wait_for(predicate, proc: subprocess.Popen | None = None, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended before the interruption: {proc.stderr.read()}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.slow
def test_record_check_shared_cache_query_verify_prune_through_s3(server, tmp_path):
    bucket = server.bucket("shared")
    urls = ["--goldens", f"s3://{bucket}/goldens", "--store", f"s3://{bucket}/store",
            "--cache", f"s3://{bucket}/cache"]
    proj = project(tmp_path / "p")
    cli = Cli(server, tmp_path / "home")

    p = cli(proj, *urls, "record", *FAST, "--format", "json")
    clean(p)
    assert report(p)["counts"] == {"RECORDED": 4}
    objects = server.keys(bucket, "goldens/")
    assert len([k for k in objects if k.endswith("/zarr.json")]) == 5      # the root group and 4 goldens

    # plain zarr reads the goldens from the URL (the snippet of docs/goldens-layout.md)
    doc = (ROOT / "docs" / "goldens-layout.md").read_text()
    snippet = doc.split("```python remote\n", 1)[1].split("```", 1)[0]
    for _ in range(2):
        p = subprocess.run([PY, "-c", snippet.replace("s3://my-bucket/goldens", f"s3://{bucket}/goldens")],
                           env={**cli.env, "AWS_ALLOW_HTTP": "true"}, capture_output=True, text=True, timeout=120)
        if p.returncode != -signal.SIGABRT:
            break
        # once in a CI run (0 of 80 here) the process aborted at interpreter exit, its output
        # complete: zarr's event-loop thread against obstore's runtime, neither of them ours;
        # once more, and it must exit 0
    assert p.returncode == 0, p.stderr
    assert sorted(line.split()[1] for line in p.stdout.splitlines() if line.split()[0].endswith("-s0")) == \
        ["add", "exp", "lin", "relu"]

    p = cli(proj, *urls, "goldens", "verify")
    assert p.returncode == 0 and "4 goldens checked, 0 corrupt" in p.stdout, p.stdout + p.stderr

    # a check exports and shares its artifacts; a fresh runner (nothing cached on its disk) downloads them
    first = report(cli(proj, *urls, "check", "-b", "onnx_cpu_fp32", *FAST, "--format", "json"))
    assert first["counts"] == {"PASS": 4}
    assert not any(r["cache_hit"] for r in first["results"])
    runner = Cli(server, tmp_path / "runner")
    second = report(runner(proj, *urls, "check", "-b", "onnx_cpu_fp32", *FAST, "--format", "json"))
    assert second["counts"] == {"PASS": 4}
    assert all(r["cache_hit"] for r in second["results"])
    assert list((tmp_path / "runner" / "opdiff-home" / "artifacts").iterdir())

    # the history, read on yet another machine
    reader = Cli(server, tmp_path / "reader")
    p = reader(proj, *urls, "query", "SELECT command, count(*) AS n, bool_and(complete) AS done FROM results "
               "JOIN runs USING (run_id) GROUP BY ALL ORDER BY ALL", "--format", "json")
    clean(p)
    assert json.loads(p.stdout) == [{"command": "check", "n": 8, "done": True},
                                    {"command": "record", "n": 4, "done": True}]
    p = reader(proj, *urls, "runs")
    rows = table_rows(p.stdout)
    assert sum("yes" in row for row in rows) == 3, p.stdout     # three complete runs
    assert {first["run_id"], second["run_id"]} <= {row[0] for row in rows}

    # prune: `exp` left the suite
    (proj / "suites" / "small.yaml").write_text(SUITE.replace(
        "  - {id: exp, op: aten::exp.default, in: [{ref: x}]}\n", ""))
    p = cli(proj, *urls, "goldens", "prune", "--yes")
    assert p.returncode == 0 and "deleted exp seed=0" in p.stdout, p.stdout + p.stderr
    left = server.keys(bucket, "goldens/")
    assert sorted(k.split("/")[1].split("-")[0] for k in left if k.count("/") == 2 and k.endswith("/zarr.json")) == \
        ["add", "lin", "relu"]

    # the secret key is nowhere: not in any output, any object, any local file
    secret = server.secret
    assert all(secret not in out for out in cli.outputs + runner.outputs + reader.outputs)
    assert all(secret.encode() not in data for data in server.keys(bucket).values())
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


@pytest.mark.slow
@pytest.mark.parametrize("later", [False, True], ids=["write", "write_later"])
def test_two_writers_into_one_bucket_lose_nothing(server, tmp_path, monkeypatch, later):
    """Two processes write 60 goldens each into one new remote store at once, ten of them
    the same (test, seed) with different contents: every golden is there, whole, and
    each one wholly one writer's. `write_later`: each writer lists the empty store first
    (so it takes every golden for new) and writes from its threads, as record does."""
    bucket = server.bucket(f"twowriters{int(later)}")
    url = f"s3://{bucket}/goldens"
    env = server.env(tmp_path, WRITER_LATER=str(int(later)))
    env["PYTHONPATH"] = str(ROOT)
    procs = [subprocess.Popen([PY, "-c", WRITER, url, tag, first, "60", "-"], env=env, stderr=subprocess.PIPE)
             for tag, first in (("1", "0"), ("2", "50"))]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    from opdiff_snap.goldens import GoldenStore

    use_server(monkeypatch, server, tmp_path)
    assert sorted(_check_whole(GoldenStore(url))) == sorted(f"w{i}" for i in range(110))


def test_a_unit_taken_for_new_replaces_what_another_writer_put_there(server, tmp_path, monkeypatch):
    """A unit published as new (`fresh`) where another writer has meanwhile published one, or
    left data without its marker, ends up wholly the new one."""
    from opdiff_snap.storage.s3 import S3Place

    use_server(monkeypatch, server, tmp_path)
    bucket = server.bucket("fresh")
    place = S3Place(f"s3://{bucket}/p")
    place.publish("u", {"0": b"theirs", "1": b"theirs", "m": b"1"}, "m")
    place.publish("u", {"0": b"mine", "1": b"mine", "m": b"2"}, "m", fresh=True)
    place.put("v/1", b"debris")
    place.publish("v", {"0": b"mine", "1": b"mine", "m": b"3"}, "m", fresh=True)
    place.publish("w", {"0": b"mine", "m": b"4"}, "m", fresh=True)
    assert server.keys(bucket, "p/") == {"p/u/0": b"mine", "p/u/1": b"mine", "p/u/m": b"2", "p/v/0": b"mine",
                                         "p/v/1": b"mine", "p/v/m": b"3", "p/w/0": b"mine", "p/w/m": b"4"}


def _history_items(server: S3Server, bucket: str, command: str) -> list[dict]:
    """The item lines of the `command` runs in the bucket's history, as uploaded so far."""
    out = []
    for data in server.keys(bucket, "store/runs/").values():
        lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        if lines and lines[0].get("command") == command:
            out += [x for x in lines if x.get("type") == "item"]
    return out


def test_a_golden_refused_mid_record_stops_the_run_and_loses_nothing(server, tmp_path, monkeypatch):
    """Goldens travel to the service from several threads while record goes on: the service
    refusing one in the middle of the run (a policy denies writing the third test's) stops
    it with our message naming that test, exit 2; the items before it are reported with
    their goldens in the store, every visible golden is whole, and a rerun with the
    permission records only what is missing."""
    bucket = server.bucket("refused")
    urls = ["--goldens", f"s3://{bucket}/goldens", "--store", f"s3://{bucket}/store"]
    proj = project(tmp_path / "p")
    key, secret = server.user("noexp", [{"Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{bucket}/goldens/exp-*"}])
    refused = Cli(server, tmp_path / "home", AWS_ACCESS_KEY_ID=key, AWS_SECRET_ACCESS_KEY=secret,
                  OPDIFF_UPLOAD_EVERY_S="0")
    p = refused(proj, *urls, "record", *FAST)
    assert p.returncode == 2, p.stderr
    assert "cannot write the golden of test 'exp' seed 0" in p.stderr and "denied writing" in p.stderr, p.stderr
    assert "run `opdiff record` again" in p.stderr and "Traceback" not in p.stderr, p.stderr
    from opdiff_snap.goldens import GoldenStore

    use_server(monkeypatch, server, tmp_path / "inspect")
    store = GoldenStore(f"s3://{bucket}/goldens")
    visible = {i.test_id for i in store.index()}
    assert store.verify() == [] and {"add", "relu"} <= visible <= {"add", "relu", "lin"}
    reported = _history_items(server, bucket, "record")
    assert [(x["id"], x["status"]) for x in reported] == [("add", "RECORDED"), ("relu", "RECORDED")]

    p = Cli(server, tmp_path / "home")(proj, *urls, "record", *FAST, "--format", "json")
    clean(p)
    assert report(p)["counts"] == {"KEPT": len(visible), "RECORDED": 4 - len(visible)}
    assert store.verify() == [] and len(GoldenStore(f"s3://{bucket}/goldens").index()) == 4


def use_server(monkeypatch, server: S3Server, home: Path) -> None:
    """This process as a client of `server` (its credentials through the AWS variables)."""
    for k, v in server.env(home).items():
        if k.startswith("AWS_") or k == "OPDIFF_CACHE_HOME":
            monkeypatch.setenv(k, v)


def _checked(server: S3Server, bucket: str) -> list[dict]:
    """The item lines of the check runs in the bucket's history, as uploaded so far."""
    out = []
    for data in server.keys(bucket, "store/runs/").values():
        lines = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
        if lines and lines[0].get("command") == "check":
            out += [x for x in lines if x.get("type") == "item"]
    return out


@pytest.mark.slow
def test_a_killed_check_resumes_from_the_remote_copy_elsewhere(server, tmp_path):
    bucket = server.bucket("resume")
    urls = ["--goldens", f"s3://{bucket}/goldens", "--store", f"s3://{bucket}/store"]
    proj = project(tmp_path / "p", SLOW_SUITE, {"slow.py": SLOW_PY})
    clean(Cli(server, tmp_path / "box1")(proj, *urls, "record", *FAST))
    cli = Cli(server, tmp_path / "box1", OPDIFF_UPLOAD_EVERY_S="0", SLOW_S="1")
    run = cli.popen(proj, *urls, "check", "-b", "torch_cpu_fp32", *FAST, "--no-cache")
    wait_for(lambda: len(_checked(server, bucket)) >= 2, run)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    done_before = len(_checked(server, bucket))
    assert 2 <= done_before < 8

    other = Cli(server, tmp_path / "box2")          # another machine: no spool of that run
    p = other(proj, *urls, "runs")
    assert "resumable" in p.stdout, p.stdout
    run_id = resumable(p.stdout)
    p = other(proj, *urls, "check", "-b", "torch_cpu_fp32", *FAST, "--no-cache", "--resume", run_id,
              "--format", "json")
    clean(p)
    assert report(p)["counts"] == {"PASS": 8}
    p = other(proj, *urls, "query", "SELECT count(*) AS n, count(DISTINCT test_id) AS tests, "
              f"bool_and(complete) AS done FROM results JOIN runs USING (run_id) WHERE run_id = '{run_id}'",
              "--format", "json")
    assert json.loads(p.stdout) == [{"n": 8, "tests": 8, "done": True}]


@pytest.mark.slow
def test_the_server_dying_mid_record_and_mid_check(server, tmp_path, monkeypatch):
    """The service the client talks to dies (its process is killed) in the middle of a
    record, then of a check: a clear error, nothing half-written visible, and a rerun
    completes once it is back."""
    bucket = server.bucket("dying")
    urls = ["--goldens", f"s3://{bucket}/goldens", "--store", f"s3://{bucket}/store",
            "--cache", f"s3://{bucket}/cache"]
    proj = project(tmp_path / "p", SLOW_SUITE, {"slow.py": SLOW_PY})
    relay = Relay(server.port)
    cli = Cli(server, tmp_path / "home", relay.endpoint, OPDIFF_UPLOAD_EVERY_S="0")
    slow = Cli(server, tmp_path / "home", relay.endpoint, OPDIFF_UPLOAD_EVERY_S="0", SLOW_S="0.7")

    def goldens() -> list[str]:
        return [k for k in server.names(bucket, "goldens/") if k.endswith("/zarr.json") and k.count("/") == 2]

    run = slow.popen(proj, *urls, "record", *FAST)
    wait_for(lambda: len(goldens()) >= 2, run)
    relay.kill()
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    assert "cannot reach the S3 service" in err and "Traceback" not in err, err
    from opdiff_snap.goldens import GoldenStore

    use_server(monkeypatch, server, tmp_path / "inspect")
    store = GoldenStore(f"s3://{bucket}/goldens")
    visible = store.index()
    assert 2 <= len(visible) < 8 and store.verify() == []   # only whole goldens are visible
    assert all(store.read(i.test_id, i.seed).outputs is not None for i in visible)

    relay = Relay(server.port, relay.port)
    p = cli(proj, *urls, "record", *FAST, "--format", "json")
    clean(p)
    counts = report(p)["counts"]
    assert counts["KEPT"] == len(visible) and counts["RECORDED"] == 8 - len(visible)

    run = slow.popen(proj, *urls, "check", "-b", "onnx_cpu_fp32", *FAST)
    wait_for(lambda: len(_checked(server, bucket)) >= 1, run)
    relay.kill()
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2 and "cannot reach the S3 service" in err and "Traceback" not in err, err
    cache = server.keys(bucket, "cache/")
    # a shared entry is used only with its `complete` marker, written after its files
    markers = [k for k in cache if k.endswith("/complete")]
    assert markers, "the checked item's artifact reached the shared cache"
    for marker in markers:
        entry = marker[:-len("complete")]
        assert {entry + "entry.json", entry + "work/model.onnx"} <= set(cache)

    relay = Relay(server.port, relay.port)
    p = cli(proj, *urls, "runs")
    run_id = resumable(p.stdout)
    p = cli(proj, *urls, "check", "-b", "onnx_cpu_fp32", *FAST, "--resume", run_id, "--format", "json")
    clean(p)
    assert report(p)["counts"] == {"PASS": 8}
    relay.kill()


def test_wrong_credentials_and_a_missing_bucket_are_clear_errors(server, tmp_path):
    bucket = server.bucket("creds")
    proj = project(tmp_path / "p")
    wrong = Cli(server, tmp_path / "h1", AWS_SECRET_ACCESS_KEY="not-the-secret-" + "x" * 20)
    p = wrong(proj, "--goldens", f"s3://{bucket}/goldens", "goldens", "ls")
    # ours: the service refused, while doing what, where; the service's own error code is its word
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("opdiff: error: the S3 service (") and "refused the credentials while" in p.stderr
    assert f"s3://{bucket}/goldens" in p.stderr and "AWS_SECRET_ACCESS_KEY" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "not-the-secret-" not in p.stderr + p.stdout
    unknown = Cli(server, tmp_path / "h2", AWS_ACCESS_KEY_ID="AKIAUNKNOWNKEY000000")
    p = unknown(proj, "--store", f"s3://{bucket}/store", "query", "SELECT 1")
    assert p.returncode == 2 and "refused the credentials while" in p.stderr, p.stderr
    assert f"s3://{bucket}/store" in p.stderr and "Traceback" not in p.stderr, p.stderr

    cli = Cli(server, tmp_path / "h3")
    p = cli(proj, "--goldens", "s3://no-such-bucket/goldens", "--store", str(tmp_path / "store"), "record", *FAST)
    assert p.returncode == 2, p.stderr
    assert "the bucket 'no-such-bucket' does not exist" in p.stderr and "Traceback" not in p.stderr
    assert not list((tmp_path / "store").glob("runs/*.jsonl"))      # nothing was run
    p = cli(proj, "--store", "s3://no-such-bucket/store", "runs")
    assert p.returncode == 2 and "the bucket 'no-such-bucket' does not exist" in p.stderr, p.stderr


def test_no_credentials_say_where_they_are_looked_for(server, tmp_path):
    """No credentials anywhere: the chain ends at the instance metadata service (here a
    refusing one on loopback, never a real one), and the error says that none were found and
    where they are looked for, instead of quoting what the metadata service said."""
    bucket = server.bucket("nocreds")
    proj = project(tmp_path / "p")
    imds = MetadataService()
    try:
        cases = {"no-settings": {}, "metadata-off": {"AWS_EC2_METADATA_DISABLED": "true"},
                 "empty-profile": {}}
        for name, extra in cases.items():
            cli = Cli(server, tmp_path / name)
            for key in [k for k in cli.env if k.startswith("AWS_")]:
                del cli.env[key]
            cli.env.update(AWS_ENDPOINT_URL=server.endpoint, AWS_REGION="us-east-1", **imds.env(), **extra)
            if name == "empty-profile":   # a profile file without credentials: boto3 asks the chain
                (tmp_path / name / ".aws").mkdir(parents=True)
                (tmp_path / name / ".aws" / "config").write_text("[default]\nregion = us-east-1\n")
            asked = len(imds.requests)
            p = cli(proj, "--store", f"s3://{bucket}/store", "query", "SELECT 1")
            assert p.returncode == 2, (name, p.stdout + p.stderr)
            clean(p)
            assert "no AWS credentials were found for s3://" in p.stderr, (name, p.stderr)
            for setting in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "~/.aws/credentials", "AWS_WEB_IDENTITY_TOKEN_FILE",
                            "instance metadata service"):
                assert setting in p.stderr, (name, setting, p.stderr)
            assert MetadataService.BODY.decode() not in p.stderr, (name, p.stderr)
            if name == "metadata-off":
                assert "AWS_EC2_METADATA_DISABLED" in p.stderr
                assert len(imds.requests) == asked      # not asked at all
            else:
                assert len(imds.requests) > asked       # asked, and refused
        p = cli(proj, "--goldens", f"s3://{bucket}/goldens", "record", *FAST)
        assert p.returncode == 2 and "no AWS credentials were found" in p.stderr, p.stderr
        assert not server.keys(bucket)                   # nothing was written
    finally:
        imds.stop()


def test_settings_take_urls_and_the_endpoint(tmp_path):
    from opdiff_snap.core.config import load_settings
    from opdiff_snap.core.errors import OpdiffError

    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [tool.opdiff]
        goldens = "s3://team-bucket/opdiff/goldens/"
        store = "s3://team-bucket/opdiff/store"
        cache = "local-cache"
        s3-endpoint = "https://minio.example.com"
        """))
    s = load_settings(tmp_path)
    assert s.goldens == "s3://team-bucket/opdiff/goldens" and s.store == "s3://team-bucket/opdiff/store"
    assert s.cache == tmp_path / "local-cache" and s.s3_endpoint == "https://minio.example.com"
    assert s.with_overrides(store="s3://other/x").store == "s3://other/x"
    with pytest.raises(OpdiffError, match="only local paths and s3://"):
        s.with_overrides(goldens="gs://bucket/x")
    (tmp_path / "pyproject.toml").write_text('[tool.opdiff]\ns3-endpoint = "minio:9000"\n')
    with pytest.raises(OpdiffError, match="s3-endpoint must be the URL"):
        load_settings(tmp_path)
