"""A place in an S3-compatible bucket (AWS S3, MinIO, R2, GCS's S3 API), through obstore.

Credentials come from the standard AWS chain: the environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, web identity, container and instance
credentials, read by obstore itself) and, when no key is in the environment, a profile of
~/.aws/config and ~/.aws/credentials (AWS_PROFILE) through boto3 where it is installed.
The endpoint of a service other than AWS comes from AWS_ENDPOINT_URL (or
AWS_ENDPOINT_URL_S3), which `--s3-endpoint` and `[tool.opdiff] s3-endpoint` set.

Errors become StorageError naming the URL and what to do; a credential never appears in
one (messages are built from the service's error code, and any text quoted from the
service is scrubbed of the environment's secrets). When the chain finds no credentials at
all (its last link, the instance metadata service, refuses, cannot be reached or is
switched off), the error says so and lists where they are looked for.

Every request is bounded: CONNECT_TIMEOUT_S to connect, READ_TIMEOUT_S without a byte from
the service (OPDIFF_S3_CONNECT_TIMEOUT_S and OPDIFF_S3_READ_TIMEOUT_S override them), and a
failed request is retried RETRIES times while RETRY_WINDOW_S have not passed since its first
attempt; so a service that accepts connections and never answers fails a request within
RETRY_WINDOW_S plus one read timeout.

Units (see base.Place) are written data objects first and the marker last, then the data
objects are read back: if another writer replaced them in between, the unit is written
again, so the marker never stays beside another writer's data. Replacing or removing a
unit deletes its marker first, so readers skip it meanwhile. A unit the caller saw no
trace of (`fresh`) skips that delete: its data objects are written create-only (a
conditional put, If-None-Match), so they land only where no object was, never under a
marker readers trust (a marker is written after its data and deleted before it, so one
without its data exists only while a writer that will read back and rewrite is at work);
should any already exist, it is replaced as above. That is three round trips instead of
four. A service that ignores the condition overwrites instead, and the read-back still
catches another writer.
"""

from __future__ import annotations

import builtins
import math
import os
import re
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable, Mapping

from .local import unique
from .place import Entry, ObjectTooLarge, Place, StorageError, Stray

THREADS = 16
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 10.0
RETRIES = 3
RETRY_WINDOW_S = 20.0
REQUEST_TIMEOUT_S = 120.0   # a whole request, body included, while data flows (a large upload)
_CLIENTS: dict[tuple, Any] = {}


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def split_url(url: str) -> tuple[str, str]:
    m = re.fullmatch(r"s3://([^/]+)/?(.*)", url)
    if not m or not m.group(1):
        raise StorageError(f"'{url}' is not an S3 location: write s3://BUCKET/PREFIX (the prefix may be "
                           "empty).")
    return m.group(1), m.group(2).strip("/")


# where the chain looks, in its order, for the message that says none was found
CHAIN = ("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN) in the environment; a "
         "profile (AWS_PROFILE, else 'default') of ~/.aws/credentials or ~/.aws/config "
         "(AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE); web identity (AWS_WEB_IDENTITY_TOKEN_FILE with "
         "AWS_ROLE_ARN); container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI); and "
         "last the EC2 instance metadata service")
# the instance metadata service's token and credential paths (its protocol, not any client's words)
_METADATA_PATHS = re.compile(r"/latest/(api/token|meta-data/iam/security-credentials)")


def _configured_source() -> str | None:
    """The link of the chain the environment configures, or None: only the instance
    metadata service is left to ask."""
    env = os.environ
    if env.get("AWS_ACCESS_KEY_ID"):
        return "environment"
    if env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and env.get("AWS_ROLE_ARN"):
        return "web identity"
    if env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        return "container"
    if _profile_configured():
        return "profile"
    return None


def no_credentials(where: str, why: str) -> StorageError:
    return StorageError(f"no AWS credentials were found for {where}: {why}. They are looked for in: {CHAIN}. "
                        "Set one of them (e.g. export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run "
                        "`aws configure`) and run the command again; what was already stored is unchanged.")


def _metadata_disabled() -> bool:
    return os.environ.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true"


def _seconds(name: str, default: float) -> float:
    """A timeout in seconds from the environment variable `name`, else `default`."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and 0 < value <= 3600):
        raise StorageError(f"{name}={text!r} is not a timeout: give a number of seconds above 0 and at most "
                           f"3600 (the default is {default:g}), or unset it.")
    return value


def timeouts() -> tuple[float, float]:
    """(connect, read) timeouts in seconds, as this process's environment sets them."""
    return (_seconds("OPDIFF_S3_CONNECT_TIMEOUT_S", CONNECT_TIMEOUT_S),
            _seconds("OPDIFF_S3_READ_TIMEOUT_S", READ_TIMEOUT_S))


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _client(bucket: str, prefix: str):
    """An obstore S3Store for bucket/prefix (one per process and location)."""
    endpoint = _endpoint()
    connect_s, read_s = timeouts()
    key = (bucket, prefix, endpoint, os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_PROFILE"),
           connect_s, read_s)
    if key in _CLIENTS:
        return _CLIENTS[key]
    try:
        from obstore.store import S3Store
    except ImportError:
        raise StorageError("s3:// stores need obstore: pip install 'opdiff-snap[s3]'.") from None
    config: dict[str, str] = {}
    if endpoint:
        config["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            config["allow_http"] = "true"
    kwargs: dict[str, Any] = {}
    where = f"s3://{bucket}/{prefix}".rstrip("/")
    source = _configured_source()
    if source is None and _metadata_disabled():
        raise no_credentials(where, "the environment names none, and AWS_EC2_METADATA_DISABLED switches off "
                                    "the instance metadata service")
    if not os.environ.get("AWS_ACCESS_KEY_ID") and _profile_configured():
        try:
            import boto3
            from obstore.auth.boto3 import Boto3CredentialProvider

            session = boto3.Session()
            if session.get_credentials() is None:   # boto3 has asked the whole chain
                raise no_credentials(where, "the profile files hold none for the profile "
                                            f"'{session.profile_name}', and no other link of the chain gave any")
            kwargs["credential_provider"] = Boto3CredentialProvider(session)
            if session.region_name and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
                config["region"] = session.region_name
        except ImportError:
            pass   # obstore alone: environment, web identity, container and instance credentials
    if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "region" in config):
        config["region"] = "us-east-1"
    retry = {"max_retries": RETRIES, "retry_timeout": timedelta(seconds=RETRY_WINDOW_S),
             "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=2),
                         "base": 2.0}}
    client = S3Store(bucket, prefix=prefix or None, config=config, retry_config=retry,  # type: ignore[arg-type]
                     client_options={"connect_timeout": _duration(connect_s), "read_timeout": _duration(read_s),
                                     "timeout": _duration(max(REQUEST_TIMEOUT_S, read_s))}, **kwargs)
    _CLIENTS[key] = client
    return client


def _profile_configured() -> bool:
    if os.environ.get("AWS_PROFILE"):
        return True
    files = [os.environ.get("AWS_SHARED_CREDENTIALS_FILE"), os.environ.get("AWS_CONFIG_FILE"),
             str(Path.home() / ".aws" / "credentials"), str(Path.home() / ".aws" / "config")]
    return any(f and os.path.isfile(f) for f in files)


def scrub(text: str) -> str:
    """`text` without any credential of the environment in it."""
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def storage_error(exc: BaseException, doing: str, where: str) -> StorageError:
    """A clear error for what the service or the network said while `doing` `where`."""
    text = str(exc)
    endpoint = _endpoint() or "AWS S3"
    if _configured_source() is None and _METADATA_PATHS.search(text):
        status = re.search(r"\b([45][0-9][0-9])\b", text.split("\n\nDebug source", 1)[0])
        said = f"it answered HTTP {status.group(1)}" if status else "it could not be reached"
        return no_credentials(where, "the environment names none, and the instance metadata service, the last "
                                     f"place asked, gave none ({said})")
    chain = ("Credentials come from the standard AWS chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
             "AWS_SESSION_TOKEN, AWS_PROFILE or ~/.aws/credentials)")
    if any(code in text for code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken",
                                      "ExpiredToken", "AuthorizationHeaderMalformed")) \
            or type(exc).__name__ == "UnauthenticatedError":
        code = next((c for c in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                                 "AuthorizationHeaderMalformed") if c in text), "unauthenticated")
        return StorageError(f"the S3 service ({endpoint}) refused the credentials while {doing} {where} "
                            f"({code}). {chain}: check them, and that --s3-endpoint (or AWS_ENDPOINT_URL) "
                            "names the service they belong to.")
    if "NoSuchBucket" in text:
        bucket = where.split("/")[2] if where.startswith("s3://") else where
        return StorageError(f"the bucket '{bucket}' does not exist on the S3 service ({endpoint}), so "
                            f"{doing} {where} failed. Create it (`aws s3 mb s3://{bucket}`) or fix the "
                            "bucket name in --goldens/--store/--cache (or [tool.opdiff]).")
    if "AccessDenied" in text or type(exc).__name__ == "PermissionDeniedError":
        return StorageError(f"the S3 service ({endpoint}) denied {doing} {where} (AccessDenied): the "
                            "credentials are valid but lack the permission. Grant s3:GetObject, "
                            f"s3:PutObject, s3:DeleteObject and s3:ListBucket on it. {chain}.")
    lowered = text.lower()
    if any(s in lowered for s in ("error sending request", "connection refused", "dns error", "timed out",
                                  "connection reset", "broken pipe", "connection closed", "tcp connect")):
        return StorageError(f"cannot reach the S3 service ({endpoint}) while {doing} {where}: "
                            f"{_what_failed(text)}. Check that the service is up and that --s3-endpoint (or "
                            "AWS_ENDPOINT_URL) names it; what was already stored is unchanged, and the "
                            "command can be run again once it is reachable.")
    first = scrub(text.split("\n\nDebug source", 1)[0]).strip().splitlines()[0][:300] if text.strip() else ""
    return StorageError(f"the S3 service ({endpoint}) failed while {doing} {where}: {type(exc).__name__}: "
                        f"{first}")


def _what_failed(text: str) -> str:
    """What went wrong on the way to the service, from obstore's text: a timeout names the
    limit that ran out (and the variable that sets it)."""
    endpoint = _endpoint() or "AWS S3"
    connect_s, read_s = timeouts()
    m = re.search(r"after (\d+) retries", text)
    tries = f" ({int(m.group(1)) + 1} attempts)" if m else ""
    timed_out = "kind: Timeout" in text or "TimedOut" in text or "timed out" in text.lower()
    connecting = "tcp connect error" in text.lower() or "Connect," in text
    if timed_out and connecting:
        return (f"no connection to {endpoint} within {connect_s:g} s{tries} (OPDIFF_S3_CONNECT_TIMEOUT_S "
                "sets that limit)")
    if timed_out:
        return (f"no answer from {endpoint} within {read_s:g} s{tries}: it accepted the connection but sent "
                "nothing back (OPDIFF_S3_READ_TIMEOUT_S sets that limit)")
    if "connection refused" in text.lower():
        return f"the connection was refused{tries}: nothing listens at {endpoint}"
    return f"the connection failed{tries}"


def _in_threads(fn, items: list) -> list:
    """fn over `items` in THREADS threads, results in order. The first failure cancels the
    requests not yet started, so an unreachable service fails the batch within the time of
    the requests in flight, not of all of them one after another."""
    with ThreadPoolExecutor(min(THREADS, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:   # a failure, or Ctrl-C while waiting
            for f in futures:
                f.cancel()
        failed = next((f for f in futures if f.done() and not f.cancelled() and f.exception()), None)
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]
        return [f.result() for f in futures]


class S3Place(Place):
    remote = True

    def __init__(self, url: str):
        self.bucket, self.prefix = split_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.location = url.rstrip("/")
        self._store = _client(self.bucket, self.prefix)

    def _call(self, doing: str, key: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise storage_error(exc, doing, self.where(key)) from None
            raise FileNotFoundError(self.where(key)) from None
        except (StorageError, ObjectTooLarge):
            raise
        except Exception as exc:
            if type(exc).__name__ == "AlreadyExistsError":
                raise
            raise storage_error(exc, doing, self.where(key)) from None

    # ------------------------------------------------------------ objects

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        import obstore

        def read() -> bytes:
            result = obstore.get(self._store, key)
            size = int(result.meta["size"])
            if max_bytes is not None and size > max_bytes:   # the body is never fetched
                raise ObjectTooLarge(f"{self.where(key)} holds {size} bytes, more than the {max_bytes} expected")
            return bytes(result.bytes())

        return self._call("reading", key, read)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        keys = list(keys)

        def one(key: str) -> bytes | None:
            try:
                return self.get(key)
            except FileNotFoundError:
                return None

        if len(keys) <= 1:
            return {k: one(k) for k in keys}
        return dict(zip(keys, _in_threads(one, keys)))

    def put(self, key: str, data: bytes, *, create: bool = False) -> bool:
        import obstore

        try:
            self._call("writing", key, obstore.put, self._store, key, data,
                       mode="create" if create else "overwrite")
        except Exception as exc:
            if type(exc).__name__ == "AlreadyExistsError":
                return False
            raise
        return True

    def put_many(self, objects: Mapping[str, bytes]) -> None:
        items = list(objects.items())
        if len(items) <= 1:
            for k, v in items:
                self.put(k, v)
            return
        _in_threads(lambda kv: self.put(*kv), items)

    def _create_many(self, objects: Mapping[str, bytes]) -> bool:
        """Write each object only where there is none; False when any was there already."""
        items = list(objects.items())
        if len(items) == 1:
            return self.put(*items[0], create=True)
        return all(_in_threads(lambda kv: self.put(*kv, create=True), items))

    def delete(self, key: str) -> None:
        import obstore

        try:
            self._call("deleting", key, obstore.delete, self._store, key)
        except FileNotFoundError:
            pass

    def delete_many(self, keys: Iterable[str]) -> None:
        import obstore

        keys = list(keys)
        for i in range(0, len(keys), 1000):
            self._call("deleting", keys[i], obstore.delete, self._store, keys[i:i + 1000])

    def list(self, prefix: str = "") -> list[Entry]:
        import obstore

        def run():
            out = []
            for batch in obstore.list(self._store, prefix.strip("/") or None, chunk_size=1000):
                for meta in batch:
                    out.append(Entry(meta["path"], int(meta["size"]), meta["last_modified"].timestamp()))
            return out

        return sorted(self._call("listing", prefix, run), key=lambda e: e.key)

    def exists(self, key: str) -> bool:
        import obstore

        try:
            self._call("looking up", key, obstore.head, self._store, key)
        except FileNotFoundError:
            return False
        return True

    # ------------------------------------------------------------ units

    def unit_exists(self, name: str, marker: str) -> bool:
        return self.exists(f"{name}/{marker}")

    def survey(self, marker: str, keep: tuple[str, ...] = ()) -> "tuple[builtins.list[str], builtins.list[Stray]]":
        """Units whose marker object is there (the others are being written, or their writer
        died, and stay invisible); an object at the top, beside the units, is a stray."""
        units, strays = set(), []
        for e in self.list():
            top, _, rest = e.key.partition("/")
            if top.startswith(".") or top in keep:
                continue
            if not rest:
                strays.append(Stray(top, "a single object"))
            elif rest == marker:
                units.add(top)
        return sorted(units), strays

    def publish(self, name: str, objects: Mapping[str, bytes], marker: str, *, fresh: bool = False) -> None:
        data = {f"{name}/{k}": v for k, v in objects.items() if k != marker}
        if fresh and data and self._create_many(data):
            self.put(f"{name}/{marker}", objects[marker])
            back = self.get_many(data)
            if all(back[k] == v for k, v in data.items()):
                return
        for attempt in range(5):
            self.delete(f"{name}/{marker}")
            self.put_many(data)
            self.put(f"{name}/{marker}", objects[marker])
            back = self.get_many(data)
            if all(back[k] == v for k, v in data.items()):
                return
            time.sleep(0.05 * (attempt + 1))   # another writer replaced our data: write again
        raise StorageError(f"could not write {self.where(name)}: another writer kept replacing it; "
                           "run the command again.")

    def remove(self, name: str, marker: str) -> None:
        self.delete(f"{name}/{marker}")
        self.delete_many(e.key for e in self.list(name))

    def clean_debris(self, max_age_s: float, marker: str = "", keep: tuple[str, ...] = ()) -> int:
        """Delete units without their marker whose newest object is older than `max_age_s`
        (a writer that died mid-write)."""
        groups: dict[str, list[Entry]] = {}
        for e in self.list():
            if "/" in e.key:
                groups.setdefault(e.key.split("/", 1)[0], []).append(e)
        now = time.time()
        gone = 0
        for name, entries in groups.items():
            if any(e.key == f"{name}/{marker}" for e in entries):
                continue
            if now - max(e.mtime for e in entries) > max_age_s:
                self.delete_many(e.key for e in entries)
                gone += 1
        return gone

    def probe_key(self) -> str:
        return f".opdiff-probe-{unique('w')}"

    def zarr_store(self):
        """The same location as a read-only zarr store (zarr's own obstore-backed store)."""
        from zarr.storage import ObjectStore

        return ObjectStore(self._store, read_only=True)

    def zarr_array(self, key: str):
        import zarr

        return zarr.open_array(store=self.zarr_store(), path=key, mode="r")
