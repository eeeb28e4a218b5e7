"""Cached Python environments for workers, keyed by their exact requirement set.

`opdiff upgrade --with onnxruntime==1.30.0` needs an environment that holds what this one
holds with the named packages replaced. Its requirement set is:

- install: this opdiff-snap (editable from its checkout, else the released version), with
  the extras of the presets to check, and each `--with` requirement (parsed as a PEP 508
  requirement, an exact `==` pin from an index, and written back from the parsed form:
  no text a user typed reaches the installer as an option);
- constraints: every distribution installed here, pinned to its version here (torch
  included, so a bare `torch` never pulls another build), minus the named packages.

The installer installs only what the install list needs, at the constrained versions.
The environment lives under `<cache>/envs/<key>/venv`, key = sha256 of that set and the base
interpreter; a `complete` marker is written last, so a half-built environment is rebuilt,
and a failed build is removed. uv builds it when it is on PATH (with this pip's index
settings), else `python -m venv` and pip. Installation output is streamed to `say`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Mapping, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from ..core.errors import OpdiffError

ENVS_DIR = "envs"
# preset family -> the extra of opdiff-snap that installs its runtime
FAMILY_EXTRAS = {"onnx": "onnx", "executorch": "executorch", "coreml": "coreml"}
# installer output worth showing as progress (pip's and uv's)
_PROGRESS = re.compile(r"^\s*(Collecting|Processing|Downloading|Obtaining|Building|Installing|Successfully|"
                       r"Resolved|Prepared|Installed|Uninstalled|Audited|Using Python|Creating|[+-] )")


class EnvironmentBuildError(OpdiffError):
    """The installer could not build the environment; nothing was run or written."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirement(value: str) -> Requirement:
    """One `--with` value as an exact pin, NAME==VERSION (extras allowed), or OpdiffError
    saying why not. Refused: anything that is not a PEP 508 requirement (an installer
    option such as `--index-url`, a second line), a direct URL (`name @ url`), an
    environment marker, and any version specifier but one exact `==` version."""
    pin = "give an exact pin, NAME==VERSION (e.g. onnxruntime==1.30.0), so that the environment can be " \
          "built from the configured indexes and found again by it"
    text = str(value).strip()
    if text.startswith("-"):
        raise OpdiffError(f"--with {value!r}: an installer option is not a requirement; {pin}.")
    try:
        req = Requirement(text)
    except InvalidRequirement:
        raise OpdiffError(f"--with {value!r}: not a requirement; {pin}.") from None
    if req.url:
        raise OpdiffError(f"--with {value!r}: a direct URL is not installed; {pin}.")
    if req.marker is not None:
        raise OpdiffError(f"--with {value!r}: an environment marker does not belong here; {pin}.")
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        raise OpdiffError(f"--with {value!r}: {pin}.")
    try:
        Version(specs[0].version)
    except InvalidVersion:
        raise OpdiffError(f"--with {value!r}: {specs[0].version!r} is not a version; {pin}.") from None
    return req


def pinned_version(req: Requirement) -> str:
    """The version of an exact pin made by parse_requirement."""
    return next(iter(req.specifier)).version


def parse_with(values: Sequence[str]) -> dict[str, Requirement]:
    """{normalized name: requirement} from `--with NAME==VERSION` values."""
    out: dict[str, Requirement] = {}
    for value in values:
        req = parse_requirement(value)
        key = normalize(req.name)
        if key == "opdiff-snap":
            raise OpdiffError(f"--with {value!r}: opdiff-snap itself is always installed from this one "
                              "(its workers must speak the same protocol); name the libraries to change.")
        if key in out and str(out[key]) != str(req):
            raise OpdiffError(f"--with names {req.name} twice ({out[key]} and {req}); give it once.")
        out[key] = req
    if not out:
        raise OpdiffError("upgrade needs at least one --with NAME==VERSION (e.g. --with onnxruntime==1.30.0).")
    return out


def current_pins() -> dict[str, tuple[str, str]]:
    """{normalized name: (name, version)} of every distribution installed in the running
    environment's site-packages (not what PYTHONPATH adds, nor copies a package vendors on a
    path of its own, as ray does) that an index can provide again (editable and
    local-directory installs are left out)."""
    out: dict[str, tuple[str, str]] = {}
    site_dirs = {Path(d).resolve() for d in site.getsitepackages()}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        try:
            inside = Path(str(dist.locate_file(""))).resolve() in site_dirs
        except (OSError, ValueError):
            inside = False
        if not name or not inside:
            continue
        direct = dist.read_text("direct_url.json")
        if direct and ('"editable": true' in direct or '"dir_info"' in direct):
            continue
        out.setdefault(normalize(name), (name, dist.version))
    return out


@dataclass(frozen=True)
class Requirements:
    """What an environment is built from; `key()` names it in the cache."""

    install: tuple[str, ...]
    constraints: tuple[str, ...]
    python: str                       # the base interpreter: version and path

    def key(self) -> str:
        text = json.dumps({"install": self.install, "constraints": self.constraints, "python": self.python})
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def requirements_for(withs: Mapping[str, Requirement], families: Sequence[str]) -> Requirements:
    """This environment's pins with the named packages replaced; opdiff-snap from here with
    the extras of `families`."""
    from .. import __version__
    from .interpreter import source_checkout

    extras = sorted({FAMILY_EXTRAS[f] for f in families if f in FAMILY_EXTRAS})
    suffix = f"[{','.join(extras)}]" if extras else ""
    checkout = source_checkout()
    me = f"-e {checkout}{suffix}" if checkout else f"opdiff-snap{suffix}=={__version__}"
    pins = current_pins()
    constraints = tuple(sorted(pin for key, (name, version) in pins.items()
                               if key not in withs and key not in ("opdiff-snap", "pip")
                               and (pin := _pin(name, version))))
    install = (me, *sorted(str(req) for req in withs.values()))
    base = getattr(sys, "_base_executable", sys.executable)
    return Requirements(install, constraints, f"{sys.version.split()[0]} {base}")


def _pin(name: str, version: str) -> str | None:
    """NAME==VERSION of an installed distribution, written back from its parsed form (None
    when its metadata does not make an exact pin that requirement_lines would take)."""
    try:
        return str(parse_requirement(f"{name}=={version}"))
    except OpdiffError:
        return None


@dataclass
class WorkerEnv:
    root: Path
    python: Path
    reused: bool
    seconds: float
    installer: str
    requirements: Requirements
    versions: dict[str, str] = field(default_factory=dict)   # what the named packages resolved to


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def find_uv() -> str | None:
    return shutil.which("uv")


def pip_index_options() -> list[str]:
    """This environment's pip index settings (index-url, extra-index-url, find-links) as uv
    flags, so uv installs from where pip would."""
    try:
        text = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                              text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    flags: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        option = key.rsplit(".", 1)[-1]
        if sep and option in ("index-url", "extra-index-url", "find-links"):
            for v in value.strip().strip("'\"").split():
                if v not in flags.setdefault(option, []):
                    flags[option].append(v)
    out: list[str] = []
    for option, values in flags.items():
        for v in values:
            out += [f"--{option}", v]
    # pip takes the best version from all its indexes; uv by default only looks at the first
    # index that has a package at all
    return out + (["--index-strategy", "unsafe-best-match"] if out else [])


def _installer_env() -> dict[str, str]:
    """This environment's variables minus the ones that would point the new one's Python here."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_NO_INPUT"] = "1"
    return env


def _stream(cmd: list[str], say: Callable[[str], None], log: Path) -> tuple[int, str]:
    """Run an installer, its lines into `log` and the progress ones to `say`."""
    lines: list[str] = []
    with open(log, "a", encoding="utf-8") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        # a session of its own: stopped with all it started (builds, compilers) if this one stops
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", env=_installer_env(), start_new_session=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                line = line.rstrip()
                out.write(line + "\n")
                lines.append(line)
                if _PROGRESS.match(line):
                    say(re.sub(r" \(from [^)]*\)+$", "", line.strip()))
            code = proc.wait()
        except BaseException:   # Ctrl-C, a full disk: the installer does not go on alone
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
            raise
    return code, "\n".join(lines)


def conflict(output: str) -> str:
    """The lines of pip's or uv's failure output that say what could not be installed."""
    lines = [ln.rstrip() for ln in output.splitlines()]
    said: list[str] = []
    for i, ln in enumerate(lines):
        if "The conflict is caused by" in ln:   # pip: the lines up to the next blank one
            for x in lines[i + 1:i + 12]:
                if not x.strip():
                    break
                said.append(re.sub(r";.*$", "", x.strip()))    # without environment markers
            break
    if not said:
        for i, ln in enumerate(lines):
            if "No solution found" in ln:   # uv
                said = [re.sub(r"^[\s\u2570\u2500\u25b6\u2502\u00d7]+", "", x).strip()
                        for x in lines[i:i + 8] if x.strip()]
                break
    if not said:
        said = [ln.removeprefix("ERROR: ").strip() for ln in lines if ln.startswith(("ERROR:", "error:"))]
    if not said:
        said = [ln.strip() for ln in lines if ln.strip()][-4:]
    text = "; ".join(dict.fromkeys(s for s in said if s))
    return text[:1200]


def requirement_lines(reqs: Requirements) -> tuple[list[str], list[str]]:
    """(requirements.txt lines, constraints.txt lines) for the installer. The first install
    line is this opdiff-snap (ours: `-e CHECKOUT[extras]` or a release pin); every other line
    is a requirement parsed and written back (`packaging`), never starting with '-', so
    neither file can carry an installer option."""
    def clean(lines: Sequence[str]) -> list[str]:
        out = []
        for line in lines:
            req = parse_requirement(line)   # refuses options and anything not a pin
            out.append(str(req))
        return out

    return [reqs.install[0], *clean(reqs.install[1:])], clean(reqs.constraints)


def install_steps(reqs: Requirements, root: Path, uv: str | None) -> list[list[str]]:
    """The commands that build the environment under `root` (venv first, then the install).
    Requirements reach the installer only through the files requirement_lines writes; the
    command line holds our own flags and paths, and uv's copy of pip's index settings."""
    venv = root / "venv"
    python = _venv_python(venv)
    files = ["-c", str(root / "constraints.txt"), "-r", str(root / "requirements.txt")]
    if uv:
        return [[uv, "venv", "--python", sys.executable, str(venv)],
                [uv, "pip", "install", "--python", str(python), *pip_index_options(), *files]]
    return [[sys.executable, "-m", "venv", str(venv)],
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", *files]]


def ensure_environment(reqs: Requirements, cache_dir: Path, say: Callable[[str], None] = lambda s: None,
                       withs: Mapping[str, Requirement] | None = None) -> WorkerEnv:
    """The environment for `reqs` under `cache_dir/envs`: reused when complete, else built.
    Raises EnvironmentBuildError (one paragraph naming the conflict) when it cannot be built."""
    started = time.perf_counter()
    key = reqs.key()
    root = Path(cache_dir).absolute() / ENVS_DIR / key[:16]
    venv = root / "venv"
    python = _venv_python(venv)
    if (root / "complete").is_file() and python.exists():
        say(f"reusing the environment {root}")
        return WorkerEnv(root, python, True, time.perf_counter() - started,
                         (root / "complete").read_text().strip() or "?", reqs, _resolved(root))
    install, constraints = requirement_lines(reqs)
    try:
        if root.exists():
            shutil.rmtree(root)     # a build that did not finish
        root.mkdir(parents=True)
    except OSError as exc:
        raise EnvironmentBuildError(f"cannot create the environment folder {root} ({exc.strerror or exc}); "
                                    "make the cache writable or pass --cache DIR. Nothing was run.") from None
    (root / "requirements.json").write_text(json.dumps(
        {"install": reqs.install, "constraints": reqs.constraints, "python": reqs.python}, indent=1))
    (root / "constraints.txt").write_text("\n".join(constraints) + "\n")
    (root / "requirements.txt").write_text("\n".join(install) + "\n")
    log = root / "install.log"
    uv = find_uv()
    installer = "uv" if uv else "pip"
    say(f"building an environment with {installer} in {root} "
        f"({', '.join(r for r in reqs.install if not r.startswith('-e'))} over this one's pins)")
    try:
        for cmd in install_steps(reqs, root, uv):
            code, output = _stream(cmd, say, log)
            if code != 0:
                raise EnvironmentBuildError(_failure_message(reqs, withs or {}, installer, output, log))
    except BaseException:
        try:   # keep the installer's output beside the cache, drop the half-built environment
            shutil.copyfile(log, root.parent / f"{root.name}-failed.log")
        except OSError:
            pass
        shutil.rmtree(root, ignore_errors=True)
        raise
    (root / "complete").write_text(installer + "\n")
    return WorkerEnv(root, python, False, time.perf_counter() - started, installer, reqs, _resolved(root))


def _resolved(root: Path) -> dict[str, str]:
    """name -> version of the named packages as the environment holds them."""
    try:
        install = json.loads((root / "requirements.json").read_text())["install"]
    except (OSError, ValueError, KeyError):
        return {}
    out = {}
    for line in install[1:]:   # the first is this opdiff-snap
        try:
            req = parse_requirement(line)
        except OpdiffError:
            continue
        out[req.name] = pinned_version(req)
    return out


def _failure_message(reqs: Requirements, withs: Mapping[str, Requirement], installer: str, output: str,
                     log: Path) -> str:
    named = ", ".join(str(r) for r in withs.values()) or ", ".join(reqs.install[1:])
    why = conflict(output)
    needs = sorted(set(re.findall(r"depends on ([A-Za-z0-9._-]+==[^\s;,)]+)", why)))
    if re.search(r"(?i)no matching distribution|could not find a version|no version|not found in", output):
        hint = "name a version that exists (`pip index versions NAME` lists them)"
    elif needs:
        hint = ("name what it needs too, each with its own --with: "
                + " ".join(f"--with {n}" for n in needs)
                + " (an executorch release, say, needs the torch it was built against)")
    else:
        hint = ("name the other packages it needs too, each with its own --with (an executorch release, "
                "say, needs the torch it was built against: --with torch==THAT_VERSION)")
    return (f"cannot build an environment with {named} over this environment's pins: {installer} says: {why}. "
            f"To fix it, {hint}. Nothing was run and the store is unchanged (the installer's full output: "
            f"{log.parent.parent / (log.parent.name + '-failed.log')}).")
