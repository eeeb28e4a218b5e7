"""A real S3 server on loopback for the remote-store tests: moto in server mode, in its own
process, with authentication switched on (an IAM user made through its first, unsigned
calls), so wrong credentials are refused as a real service refuses them. `Relay` is a
loopback TCP relay in its own process: killing it is, for the client, the server dying,
while the data the server holds stays there to inspect and to finish against; pausing it
is the server hanging (the system still accepts connections, nothing answers).
`MetadataService` stands in for an instance metadata service that refuses, on loopback."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return   # it answers
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answered at {url}")


@dataclass
class S3Server:
    proc: subprocess.Popen
    port: int
    key: str
    secret: str

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, log: Path) -> "S3Server":
        import boto3

        port = free_port()
        env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="3")
        with open(log, "ab") as out:
            proc = subprocess.Popen([PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                    env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        endpoint = f"http://127.0.0.1:{port}"
        _wait_http(endpoint + "/moto-api/data.json", proc)
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="opdiff")
        iam.put_user_policy(UserName="opdiff", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="opdiff")["AccessKey"]
        return cls(proc, port, key["AccessKeyId"], key["SecretAccessKey"])

    def user(self, name: str, denied: list[dict]) -> tuple[str, str]:
        """(access key, secret) of a new user allowed everything but the `denied` statements
        (IAM policy statements without their "Effect")."""
        import boto3

        iam = boto3.client("iam", endpoint_url=self.endpoint, region_name="us-east-1",
                           aws_access_key_id=self.key, aws_secret_access_key=self.secret)
        iam.create_user(UserName=name)
        statements = [{"Effect": "Allow", "Action": "*", "Resource": "*"},
                      *({"Effect": "Deny", **d} for d in denied)]
        iam.put_user_policy(UserName=name, PolicyName="some", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": statements}))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def client(self, endpoint: str | None = None):
        import boto3

        return boto3.client("s3", endpoint_url=endpoint or self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.key, aws_secret_access_key=self.secret)

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under the prefix, with its bytes. An object deleted between the
        listing and its read (a writer's probe, a replaced temporary) is left out."""
        c = self.client()
        out = {}
        for name in self.names(bucket, prefix):
            try:
                out[name] = c.get_object(Bucket=bucket, Key=name)["Body"].read()
            except c.exceptions.NoSuchKey:
                continue
        return out

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        """The keys under the prefix, without reading them."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]

    def env(self, tmp: Path, endpoint: str | None = None, **more: str) -> dict[str, str]:
        """The environment a client of this server runs with (credentials as the AWS chain
        reads them; local copies of remote stores under `tmp`)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=self.key, AWS_SECRET_ACCESS_KEY=self.secret, AWS_REGION="us-east-1",
                   AWS_ENDPOINT_URL=endpoint or self.endpoint, OPDIFF_CACHE_HOME=str(tmp / "opdiff-home"),
                   HOME=str(tmp), COLUMNS="200")
        env.update(more)
        return env

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Relay:
    """A TCP relay on loopback in its own process, forwarding to `target_port`."""

    def __init__(self, target_port: int, port: int | None = None):
        self.port = port or free_port()
        self.target = target_port
        self.proc = subprocess.Popen([PYTHON, str(HERE / "relay.py"), str(self.port), str(target_port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the relay did not start")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

class MetadataService:
    """An EC2 instance metadata service on loopback that refuses every request with 403 and
    a body of its own (as a metadata endpoint behind a proxy or on a machine without a role
    does), counting the requests. `env()` points both the AWS SDKs and obstore at it."""

    BODY = b"metadata-service-refusal-7f3a: not for you"

    def __init__(self):
        self.requests: list[str] = []
        service = self

        class Refuse(http.server.BaseHTTPRequestHandler):
            def _refuse(self) -> None:
                service.requests.append(f"{self.command} {self.path}")
                self.send_response(403)
                self.send_header("Content-Length", str(len(MetadataService.BODY)))
                self.end_headers()
                self.wfile.write(MetadataService.BODY)

            do_GET = do_PUT = _refuse

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def env(self) -> dict[str, str]:
        return {"AWS_EC2_METADATA_SERVICE_ENDPOINT": self.endpoint, "AWS_METADATA_ENDPOINT": self.endpoint}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
