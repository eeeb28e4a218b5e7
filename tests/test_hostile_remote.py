"""Remote stores under faults, through the real CLI against a real S3 server on loopback
(moto's server mode, behind a relay that can be paused or killed): a service that accepts
connections and never answers, or cannot be connected to, fails within the documented
timeouts and says which; a killed record's spooled lines reach the store on the next
command; a wiped store is never taken for an empty one and never costs the local mirror
of its history; Ctrl-C says what is true of the run and leaves no worker's semaphore behind.
docs/remote.md ("What happens when") names these tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from helpers.hostile import assert_clean_failure
from helpers.remote import Relay, S3Server
from test_remote_stores import SLOW_PY, SLOW_SUITE, Cli, clean, project, report, wait_for

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--in-process", "--repeats", "1", "--warmup", "0"]
WORKERS = ["-j", "1", "--repeats", "1", "--warmup", "0"]
# what docs/remote.md promises of every request
READ_TIMEOUT_S, RETRIES, RETRY_WINDOW_S = 10, 3, 20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = S3Server.start(tmp_path_factory.mktemp("moto") / "moto.log")
    yield s
    s.stop()


def urls(bucket: str) -> list[str]:
    return ["--goldens", f"s3://{bucket}/goldens", "--store", f"s3://{bucket}/store"]


def keys(server: S3Server, bucket: str, prefix: str) -> list[str]:
    """The keys under `prefix` (not their contents: a writer may delete one meanwhile)."""
    pages = server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def goldens(server: S3Server, bucket: str) -> list[str]:
    """The test ids of the goldens readers see (their zarr.json is there)."""
    return sorted(k.split("/")[1].split("-")[0] for k in keys(server, bucket, "goldens/")
                  if k.endswith("/zarr.json") and k.count("/") == 2)


def run_lines(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def stored_runs(server: S3Server, bucket: str) -> dict[str, list[dict]]:
    """run id -> the lines of its file in the bucket."""
    return {Path(k).stem: run_lines(v) for k, v in server.keys(bucket, "store/runs/").items()}


def timed(cli: Cli, *args: str, timeout: float = 120) -> tuple:
    started = time.monotonic()
    p = cli(*args, timeout=timeout)
    return p, time.monotonic() - started


def mirror_files(home: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (home / "opdiff-home" / "mirror").glob("*/runs/*.jsonl")}


# ---------------------------------------------------------------- a slow or silent service

STARTUP_S = 40.0   # the CLI's own start (imports torch) on a loaded machine, beyond the timeouts


@pytest.mark.slow
def test_a_service_that_never_answers_fails_within_the_read_timeout(server, tmp_path):
    """The server hangs (its relay is paused: connections are accepted, nothing answers).
    Each command gives up after the read timeout, names it, exits 2, and changes nothing."""
    bucket = server.bucket("silent")
    proj = project(tmp_path / "p")
    relay = Relay(server.port)
    try:
        clean(Cli(server, tmp_path / "home", relay.endpoint)(proj, *urls(bucket), "record", *FAST))
        cli = Cli(server, tmp_path / "home", relay.endpoint, OPDIFF_S3_READ_TIMEOUT_S="1")
        p = Cli(server, tmp_path / "home", relay.endpoint, OPDIFF_S3_READ_TIMEOUT_S="0")(proj, *urls(bucket), "runs")
        assert_clean_failure(p.returncode, p.stdout, p.stderr, 2, "OPDIFF_S3_READ_TIMEOUT_S='0' is not a timeout")
        before = server.keys(bucket)

        relay.pause()
        for args in (("runs",), ("goldens", "verify"), ("record", *FAST)):
            p, took = timed(cli, proj, *urls(bucket), *args)
            assert_clean_failure(p.returncode, p.stdout, p.stderr, 2,
                                 f"no answer from {relay.endpoint} within 1 s", "OPDIFF_S3_READ_TIMEOUT_S")
            # a request: (retries + 1) attempts of 1 s each, 0.7 s of backoff between them
            assert took < (RETRIES + 1) * 1 + 1 + STARTUP_S, (args, took)
        relay.resume()
        assert server.keys(bucket) == before
        p = cli(proj, *urls(bucket), "runs")
        clean(p)
        assert p.returncode == 0 and p.stdout.count(" yes ") == 1, p.stdout
    finally:
        relay.kill()


@pytest.mark.slow
def test_a_service_that_cannot_be_connected_to_fails_within_the_connect_timeout(server, tmp_path):
    """A loopback listener whose queue of pending connections is full: the system drops new
    connection attempts, so connecting never completes."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        for _ in range(3):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(("127.0.0.1", port))
            fillers.append(c)
        try:
            endpoint = f"http://127.0.0.1:{port}"
            cli = Cli(server, tmp_path / "home", endpoint, OPDIFF_S3_CONNECT_TIMEOUT_S="1")
            p, took = timed(cli, project(tmp_path / "p"), "--store", "s3://nowhere/store", "runs")
            assert_clean_failure(p.returncode, p.stdout, p.stderr, 2,
                                 f"no connection to {endpoint} within 1 s", "OPDIFF_S3_CONNECT_TIMEOUT_S")
            assert took < (RETRIES + 1) * 1 + 1 + STARTUP_S, took
        finally:
            for c in fillers:
                c.close()


@pytest.mark.slow
def test_the_documented_timeouts_hold_without_overrides(server, tmp_path):
    """With nothing overridden, a silent service fails a command within the retry window plus
    one read timeout, as docs/remote.md says, and the message names the read timeout."""
    relay = Relay(server.port)
    try:
        relay.pause()
        cli = Cli(server, tmp_path / "home", relay.endpoint)
        p, took = timed(cli, project(tmp_path / "p"), "--store", f"s3://{server.bucket('slow')}/store", "runs")
        assert_clean_failure(p.returncode, p.stdout, p.stderr, 2,
                             f"no answer from {relay.endpoint} within {READ_TIMEOUT_S} s")
        assert took < RETRY_WINDOW_S + READ_TIMEOUT_S + STARTUP_S, took
    finally:
        relay.kill()
    doc = " ".join((ROOT / "docs" / "remote.md").read_text().split())
    assert f"within {READ_TIMEOUT_S} s (`OPDIFF_S3_READ_TIMEOUT_S`" in doc
    assert f"retried up to {RETRIES} times" in doc and f"while {RETRY_WINDOW_S} s have not passed" in doc


# ---------------------------------------------------------------- opdiff killed

@pytest.mark.slow
def test_a_killed_record_s_spooled_lines_reach_the_store_on_the_next_command(server, tmp_path):
    """A record run uploads its history when it starts and at intervals; killed in between,
    its last lines are only in this machine's spool. The next command uploads them (the
    writer is gone: its lock on the spool file went with it), and `runs` says so."""
    bucket = server.bucket("killedrecord")
    proj = project(tmp_path / "p", SLOW_SUITE, {"slow.py": SLOW_PY})
    home = tmp_path / "box1"
    cli = Cli(server, home, OPDIFF_UPLOAD_EVERY_S="3600", OPDIFF_UPLOAD_EVERY_ITEMS="1000", SLOW_S="0.5")
    run = cli.popen(proj, *urls(bucket), "record", *FAST)
    wait_for(lambda: len(goldens(server, bucket)) >= 3, run)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    written = set(goldens(server, bucket))
    [spool] = (home / "opdiff-home" / "spool").glob("*/runs/*.jsonl")
    spooled = [x for x in run_lines(spool.read_bytes()) if x.get("type") == "item"]
    [(run_id, lines)] = stored_runs(server, bucket).items()
    assert spool.stem == run_id and not [x for x in lines if x.get("type") == "item"]   # the meta line only
    assert {x["id"] for x in spooled} <= written and len(spooled) >= len(written) - 1

    p = cli(proj, *urls(bucket), "runs")
    clean(p)
    assert p.returncode == 0 and "completed from the spool" in p.stdout, p.stdout + p.stderr
    lines = stored_runs(server, bucket)[run_id]
    assert [x for x in lines if x.get("type") == "item"] == spooled
    assert lines[-1]["type"] == "recovered" and lines[-1]["items"] == len(spooled)
    assert not spool.exists()

    reader = Cli(server, tmp_path / "box2")            # another machine reads the same history
    p = reader(proj, *urls(bucket), "query", "SELECT count(*) AS n FROM results WHERE status = 'RECORDED' "
               f"AND run_id = '{run_id}'", "--format", "json")
    clean(p)
    assert json.loads(p.stdout) == [{"n": len(spooled)}] and "unknown type" not in p.stderr
    p = cli(proj, *urls(bucket), "record", *FAST, "--format", "json")
    assert report(p)["counts"] == {"KEPT": len(written), "RECORDED": 8 - len(written)}


# ---------------------------------------------------------------- a wiped store

@pytest.mark.slow
def test_a_wiped_store_is_not_taken_for_an_empty_one(server, tmp_path):
    """The bucket is emptied under a team that has used it: verify says there is nothing to
    verify (exit 2), and the history's readers stop with what differs instead of deleting this
    machine's mirror of it; the mirror can then restore the store, or be set aside."""
    bucket = server.bucket("wiped")
    proj = project(tmp_path / "p")
    home = tmp_path / "home"
    cli = Cli(server, home)
    clean(cli(proj, *urls(bucket), "record", *FAST))
    clean(cli(proj, *urls(bucket), "check", "-b", "torch_cpu_fp32", *FAST))
    p = cli(proj, *urls(bucket), "runs")
    assert p.returncode == 0 and p.stdout.count(" yes ") == 2, p.stdout + p.stderr
    mirrored = mirror_files(home)
    assert len(mirrored) == 2
    c = server.client()

    # the goldens: first the goldens go and the store's root stays, then the root goes too
    for key in server.names(bucket, "goldens/"):
        if key != "goldens/zarr.json":
            c.delete_object(Bucket=bucket, Key=key)
    p = cli(proj, *urls(bucket), "goldens", "verify")
    assert_clean_failure(p.returncode, p.stdout, p.stderr, 2, f"s3://{bucket}/goldens holds no goldens")
    c.delete_object(Bucket=bucket, Key="goldens/zarr.json")
    p = cli(proj, *urls(bucket), "goldens", "verify")
    assert_clean_failure(p.returncode, p.stdout, p.stderr, 2, f"no golden store at s3://{bucket}/goldens")

    # the history: every reader stops, naming what differs; the mirror stays as it was
    for key in server.names(bucket, "store/"):
        c.delete_object(Bucket=bucket, Key=key)
    for args in (("runs",), ("query", "SELECT count(*) FROM results")):
        p = cli(proj, *urls(bucket), *args)
        assert_clean_failure(p.returncode, p.stdout, p.stderr, 2, "lacks 2 runs", *[Path(n).stem for n in mirrored])
        assert mirror_files(home) == mirrored
    p = cli(proj, *urls(bucket), "runs", "--restore")
    clean(p)
    assert p.returncode == 0 and "restored 2 runs" in p.stdout and p.stdout.count(" yes ") == 2, p.stdout
    assert {f"{n}" for n in mirrored} == {Path(k).name for k in server.keys(bucket, "store/runs/")}

    # a run the store holds less of than the mirror
    run_id = Path(sorted(mirrored)[-1]).stem
    c.put_object(Bucket=bucket, Key=f"store/runs/{run_id}.jsonl", Body=mirrored[f"{run_id}.jsonl"].split(b"\n")[0] + b"\n")
    p = cli(proj, *urls(bucket), "runs")
    assert_clean_failure(p.returncode, p.stdout, p.stderr, 2, "holds less of 1 runs", run_id)
    assert mirror_files(home) == mirrored
    p = cli(proj, *urls(bucket), "runs", "--accept-store")
    clean(p)
    assert p.returncode == 0 and "took the history store" in p.stdout, p.stdout
    assert p.stdout.count(" yes ") == 1 and "NO: resumable" in p.stdout, p.stdout
    [aside] = (home / "opdiff-home" / "mirror").glob(f"*/set-aside/*/{run_id}.jsonl")
    assert aside.read_bytes() == mirrored[f"{run_id}.jsonl"]


# ---------------------------------------------------------------- Ctrl-C

@pytest.mark.slow
def test_ctrl_c_says_what_is_true_of_the_run(server, tmp_path):
    """Ctrl-C (SIGINT to the process group, workers included) in a record run and in a check
    run: exit 130, a message that says what stays and how to go on (a record run is run
    again, a check is resumed), no traceback, and no semaphore of a killed worker reported
    as leaked."""
    bucket = server.bucket("ctrlc")
    proj = project(tmp_path / "p", SLOW_SUITE, {"slow.py": SLOW_PY})
    cli = Cli(server, tmp_path / "home", OPDIFF_UPLOAD_EVERY_S="0", SLOW_S="1")

    run = cli.popen(proj, *urls(bucket), "record", *WORKERS)
    wait_for(lambda: len(goldens(server, bucket)) >= 2, run)
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=120)
    assert_clean_failure(run.returncode, "", err, 130, "A record run is not resumed", "run `opdiff record` again")
    assert "resumable" not in err and "leaked" not in err, err
    kept = len(goldens(server, bucket))
    cli.env["SLOW_S"] = "0.02"      # slow only where a run is to be interrupted
    p = cli(proj, *urls(bucket), "record", *FAST, "--format", "json")
    assert report(p)["counts"] == {"KEPT": kept, "RECORDED": 8 - kept}
    cli.env["SLOW_S"] = "1"

    def checked() -> int:
        return sum(len([x for x in lines if x.get("type") == "item"])
                   for lines in stored_runs(server, bucket).values() if lines and lines[0]["command"] == "check")

    run = cli.popen(proj, *urls(bucket), "check", "-b", "onnx_cpu_fp32", *WORKERS)
    wait_for(lambda: checked() >= 2, run)
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=120)
    run_id = next(r for r, lines in stored_runs(server, bucket).items() if lines[0]["command"] == "check")
    assert_clean_failure(run.returncode, "", err, 130, f"`opdiff check --resume {run_id}` finishes it")
    assert "leaked" not in err, err
    p = cli(proj, *urls(bucket), "runs")
    assert p.returncode == 0 and "NO: resumable" in p.stdout, p.stdout
