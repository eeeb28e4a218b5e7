"""What the bench scripts share: the repository root, the machine's load, timing a call or a
command, the CLI's check and query as a bench runs them, and an S3 server on loopback for
the remote-store benches.

A bench script run as `python bench/bench_x.py` has this folder on its path: `from
benchlib import ...`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def needs_test_helpers(script: str) -> None:
    """Exit with the command to use when the tests' helpers (tests/helpers: planted bugs and
    histories) are not importable: a bench that uses them runs with tests/ on PYTHONPATH."""
    if importlib.util.find_spec("helpers") is None:
        name = Path(script).relative_to(ROOT)
        sys.exit(f"{name} uses the tests' planted bugs and histories (tests/helpers): run it as "
                 f"`PYTHONPATH=tests python {name} ...` from the repository root.")


def load() -> float:
    """The machine's 1-minute load average."""
    return os.getloadavg()[0]


def wait_for_load(limit: float, step_s: int = 60, max_wait_s: int = 20 * 60) -> None:
    """Wait (at most `max_wait_s`) until the load average is at most `limit`."""
    waited = 0
    while load() > limit and waited < max_wait_s:
        print(f"load average {load():.2f} > {limit}: waiting {step_s} s", flush=True)
        time.sleep(step_s)
        waited += step_s
    print(f"load average {load():.2f} (limit {limit}) after waiting {waited} s", flush=True)


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """What `fn()` returns, and the seconds it took."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def walls(fn: Callable[[], Any], n: int) -> list[float]:
    """The seconds of each of `n` calls of `fn`."""
    return [timed(fn)[1] for _ in range(n)]


def run_timed(cmd: list[str], cwd: Path | str | None = None, env: dict[str, str] | None = None,
              ) -> tuple[float, subprocess.CompletedProcess]:
    """The seconds `cmd` ran, and its completed process (output captured as text)."""
    proc, wall = timed(lambda: subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True))
    return wall, proc


def package_env(tree: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this one) with `tree`'s package first on PYTHONPATH; a child that must
    not import the package of its working folder instead runs under `python -P`."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    return env


def cli(*args: str) -> list[str]:
    """The command line of `opdiff ARGS` under this interpreter."""
    return [sys.executable, "-m", "opdiff_snap.cli", *args]


def newest_run(store: Path) -> Path:
    """The run file of a history store written last."""
    return max((store / "runs").glob("*.jsonl"), key=lambda p: p.stat().st_mtime)


def check_once(store: Path, cache: Path, suites: list[str], preset: str, jobs: int, *extra: str) -> dict:
    """`opdiff check` of `suites` on `preset`, one repeat: its run id, wall, the load before it
    and its exit status (a failure to run at all ends the bench)."""
    before = load()
    wall, proc = run_timed(cli("--store", str(store), "--cache", str(cache), "check", *suites, "-b", preset,
                               "-j", str(jobs), "--repeats", "1", *extra), cwd=ROOT)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"check {preset} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return {"run": newest_run(store).name.removesuffix(".jsonl"), "wall_s": round(wall, 1),
            "load_1min": round(before, 2), "exit": proc.returncode}


def query(store: Path, sql: str, env: dict[str, str] | None = None) -> list[dict]:
    """The rows `opdiff query` answers on a history store, as dicts."""
    out = subprocess.run(cli("--store", str(store), "query", sql, "--format", "json"), cwd=ROOT, env=env,
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


@dataclass
class S3:
    """moto's S3 server on loopback in its own process, authentication on: its first calls
    go unsigned and make the one user whose key every client signs with."""

    proc: subprocess.Popen
    endpoint: str
    key: str
    secret: str

    @classmethod
    def start(cls, log: Path) -> S3:
        import boto3

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                    env=dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3"), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        _listening(port, proc)
        endpoint = f"http://127.0.0.1:{port}"
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                           aws_secret_access_key="bench")
        iam.create_user(UserName="bench")
        allow = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="bench", PolicyName="all", PolicyDocument=json.dumps(allow))
        made = iam.create_access_key(UserName="bench")["AccessKey"]
        return cls(proc, endpoint, made["AccessKeyId"], made["SecretAccessKey"])

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.key, aws_secret_access_key=self.secret)

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under `prefix`, by key."""
        c = self.client()
        pages = c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return {o["Key"]: c.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
                for page in pages for o in page.get("Contents", [])}

    def env(self, home: Path) -> dict[str, str]:
        """A client's environment: this server and its key, and the opdiff cache home under `home`."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        return env | {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret,
                      "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint,
                      "OPDIFF_CACHE_HOME": str(home / "opdiff-home"), "HOME": str(home), "COLUMNS": "200"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _listening(port: int, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Return once `proc` accepts connections on `port`; fail when it exits or never does."""
    for _ in range(int(timeout_s / 0.1)):
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port}")


@contextlib.contextmanager
def package_at(rev: str | None):
    """The package as it was at git revision `rev`, extracted with `git archive` into a
    temporary folder that is removed afterwards (None: no revision, yields None)."""
    if rev is None:
        yield None
        return
    import shutil
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="opdiff-bench-rev-"))
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "opdiff_snap"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
