"""Workers under another Python interpreter (`opdiff check --python PATH`).

The parent keeps planning, comparing and writing history; only the worker processes run
under PATH (another venv, conda or uv environment), so the packages the jobs see are that
environment's. A worker there is started as `PATH -I -c BOOTSTRAP FD THREADS LOG`: `-I`
keeps this shell's PYTHONPATH and the current folder off its sys.path, so it imports only
what PATH's own environment holds. The bootstrap, plain standard library, says what it found
in a hello when opdiff-snap is missing or cannot start there; otherwise pool.serve (the
worker's loop, worker.serve, reached through pool.py as every release has it) takes over
and says hello with its protocol version and environment (worker.py).

Everything that can go wrong before the first job is a WorkerEnvironmentError naming the
interpreter and the command that installs what is missing.
"""

from __future__ import annotations

import os
import subprocess
from multiprocessing.connection import Connection
from pathlib import Path

from ..core.errors import OpdiffError

# The messages between parent and worker: pickled Task objects one way, their results the
# other, after the worker's hello. Bump it when Job, Outcome or the framing change shape, so
# that a worker under another interpreter with another opdiff-snap is refused before any job.
WORKER_PROTOCOL = 2
HELLO = b"hello "


class WorkerEnvironmentError(OpdiffError):
    """No worker can run under the interpreter given; nothing was run or written."""


BOOTSTRAP = r"""
import json, sys
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[1]))
def refuse(**said):
    said.update(executable=sys.executable, python=sys.version.split()[0])
    conn.send_bytes(b"hello " + json.dumps(said).encode("utf-8"))
    sys.exit(3)
try:
    from importlib import metadata
    version = metadata.version("opdiff-snap")
except Exception:
    version = None
import importlib.util
if importlib.util.find_spec("opdiff_snap") is None:
    refuse(error="missing", opdiff_snap=version)
try:
    from opdiff_snap.execution import pool
except BaseException as exc:
    refuse(error="import", opdiff_snap=version, message="%s: %s" % (type(exc).__name__, exc))
if not hasattr(pool, "serve"):
    refuse(protocol=0, opdiff_snap=version)
pool.serve(conn, int(sys.argv[2]), sys.argv[3] or None)
"""


def resolve(python: str | os.PathLike) -> Path:
    """The interpreter to start workers with: PATH itself, or a virtual environment folder's
    bin/python. Symlinks are kept (a venv's python is a link to its base interpreter, and
    only the link's path selects the venv)."""
    given = Path(python).expanduser()
    path = given
    if path.is_dir():
        found = [path / rel for rel in ("bin/python", "bin/python3", "Scripts/python.exe")
                 if (path / rel).is_file()]
        if not found:
            raise WorkerEnvironmentError(
                f"--python {given} is a folder with no bin/python in it; give the interpreter of the "
                "environment the workers should use, e.g. --python /path/to/venv/bin/python.")
        path = found[0]
    if not path.exists():
        broken = " (a link whose target is gone)" if path.is_symlink() else ""
        raise WorkerEnvironmentError(
            f"--python {given}: no such interpreter{broken}. Give the path of a Python executable, "
            "e.g. /path/to/venv/bin/python (`python -c 'import sys; print(sys.executable)'` in that "
            "environment prints it); nothing was run.")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise WorkerEnvironmentError(
            f"--python {given} is not an executable file; give the path of a Python executable, "
            "e.g. /path/to/venv/bin/python; nothing was run.")
    return Path(os.path.abspath(path))


class ForeignProcess:
    """A worker under another interpreter, with the part of multiprocessing.Process the pool uses."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        try:
            self.popen.kill()
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        try:
            self.popen.terminate()
        except ProcessLookupError:
            pass

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


def launch(python: Path, child: Connection, threads: int, log: Path) -> ForeignProcess:
    """Start one worker under `python`, talking over `child` (the pool closes its copy)."""
    fd = child.fileno()
    with open(log, "ab") as out:
        try:
            # a session of its own from the start: the pool kills its whole group (pool.kill_group),
            # whatever it runs before its hello included
            popen = subprocess.Popen([str(python), "-I", "-c", BOOTSTRAP, str(fd), str(threads), str(log)],
                                     pass_fds=(fd,), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise WorkerEnvironmentError(
                f"--python {python}: cannot run it ({exc.strerror or exc}). Give the path of a Python "
                "executable, e.g. /path/to/venv/bin/python; nothing was run.") from None
    return ForeignProcess(popen)


def source_checkout() -> Path | None:
    """The source checkout this opdiff-snap runs from, if it runs from one."""
    import opdiff_snap

    root = Path(opdiff_snap.__file__).resolve().parent.parent
    try:
        text = (root / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if 'name = "opdiff-snap"' in text else None


def install_command(python: Path | None, extras: str = "") -> str:
    """The command that installs this very opdiff-snap under `python`."""
    from .. import __version__

    checkout = source_checkout()
    target = f"'{checkout}{extras}'" if checkout else f"'opdiff-snap{extras}=={__version__}'"
    return f"{python} -m pip install {'-e ' if checkout else ''}{target}"


def died_before_hello(python: Path, exitcode: int | None, said: str) -> WorkerEnvironmentError:
    how = f"with code {exitcode}" if exitcode is not None and exitcode >= 0 else f"from signal {-(exitcode or 0)}"
    return WorkerEnvironmentError(
        f"the worker under {python} exited {how} before it could say which opdiff-snap it runs, so it "
        "is not a Python that can run opdiff-snap workers"
        + (f". Its last output:\n{said}\n" if said else ". ")
        + f"Give a Python 3 interpreter with opdiff-snap installed (`{install_command(python)}`); "
        "nothing was run.")


def hello_refusal(python: Path | None, hello: dict) -> WorkerEnvironmentError:
    """The error for a hello that refused to serve (see BOOTSTRAP and worker.hello_message)."""
    from .. import __version__

    there = hello.get("opdiff_snap")
    if hello.get("error") == "missing":
        return WorkerEnvironmentError(
            f"{python} has no opdiff-snap (no module opdiff_snap there), so it cannot run the workers. "
            f"Install it there with `{install_command(python)}` (plus the extras of the presets you "
            "check, e.g. [onnx]), then run again; nothing was run.")
    if hello.get("error") == "import":
        return WorkerEnvironmentError(
            f"opdiff-snap {there or '(unknown version)'} under {python} cannot start a worker: "
            f"{hello.get('message')}. Install what it needs there, e.g. "
            f"`{install_command(python, '[onnx]')}` (the extras of the presets you check); nothing was run.")
    if "protocol" in hello:
        return WorkerEnvironmentError(
            f"{python} has opdiff-snap {there or '(unknown version)'}"
            + (f" at {hello['location']}" if hello.get("location") else "")
            + f", whose workers speak protocol {hello['protocol'] or 'none (too old)'}; this opdiff-snap "
            f"{__version__} speaks protocol {WORKER_PROTOCOL}, so their jobs and results would not "
            f"match. Install this opdiff-snap there: `{install_command(python)}`; nothing was run.")
    return WorkerEnvironmentError(
        f"the worker under {python} said something that is not an opdiff-snap hello "
        f"({hello.get('message', '')}); give an interpreter with opdiff-snap installed "
        f"(`{install_command(python)}`); nothing was run.")


PROBE = r"""
import json, sys
def say(**said):
    said.update(executable=sys.executable, python=sys.version.split()[0])
    sys.stdout.write("hello " + json.dumps(said) + "\n")
    sys.stdout.flush()
    sys.exit(0)
try:
    from importlib import metadata
    version = metadata.version("opdiff-snap")
except Exception:
    version = None
import importlib.util
if importlib.util.find_spec("opdiff_snap") is None:
    say(error="missing", opdiff_snap=version)
try:
    from opdiff_snap.execution import interpreter, pool
except BaseException as exc:
    say(error="import", opdiff_snap=version, message="%s: %s" % (type(exc).__name__, exc))
if not hasattr(pool, "serve"):
    say(protocol=0, opdiff_snap=version)
say(ready=True, protocol=getattr(interpreter, "WORKER_PROTOCOL", 0), opdiff_snap=version)
"""


def probe(python: Path, timeout_s: float = 60.0) -> None:
    """Ask `python` whether it can run this opdiff-snap's workers, the way a worker starts
    (`-I`, the same imports), without running a job: for commands that must know both sides
    can run before either writes anything. WorkerEnvironmentError when it cannot."""
    import json

    try:
        done = subprocess.run([str(python), "-I", "-c", PROBE], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout_s, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise WorkerEnvironmentError(
            f"--python {python} did not say whether it can run opdiff-snap workers within {timeout_s:g} s (it "
            "hangs, or takes that long to import opdiff-snap); give an interpreter with opdiff-snap installed "
            f"(`{install_command(python)}`); nothing was run.") from None
    except OSError as exc:
        raise WorkerEnvironmentError(
            f"--python {python}: cannot run it ({exc.strerror or exc}). Give the path of a Python "
            "executable, e.g. /path/to/venv/bin/python; nothing was run.") from None
    out = done.stdout.decode("utf-8", "replace")
    line = next((ln for ln in out.splitlines() if ln.startswith(HELLO.decode())), None)
    if line is None:
        said = (out + done.stderr.decode("utf-8", "replace")).strip()[-2000:]
        raise died_before_hello(python, done.returncode, said)
    try:
        hello = json.loads(line[len(HELLO):])
    except ValueError:
        hello = {"message": line[:200]}
    if not isinstance(hello, dict):
        hello = {"message": line[:200]}
    if hello.get("ready") and hello.get("protocol") == WORKER_PROTOCOL:
        return
    if hello.get("ready"):
        hello.pop("ready")
    raise hello_refusal(python, hello)
