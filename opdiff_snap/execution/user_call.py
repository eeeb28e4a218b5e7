"""A job for a callable the user built in their own process (the pytest fixture's module),
sent to a worker by value.

Suite tests reach a worker as data (a TestCase and an Invocation) and the worker builds
the module. A module built by the user's own test code cannot be rebuilt from data, so
it travels pickled: its parameters and attributes by value, its classes by reference.
A class defined in a test file is not importable by name in a fresh process in
general (pytest's import modes name test modules as they please), so `ship` also
records the file of every module a class or function of the pickle comes from, and the
parent's sys.path; the worker imports those modules by name, or from their files when
the name does not lead there, before the classes are looked up. Only top-level classes
and functions can be found that way: a lambda or a class defined inside a test function
cannot be sent, and `ship` says so.

The worker loads the stored weights into the callable, builds its flat module
(prepare_call) and runs it as an ordinary Job (runner.run_job): the same export, cache,
timing and float64 reference as for suite tests.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import io
import os
import pickle
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.base import Preset
from ..core.errors import error_text
from ..core.verdicts import Verdict
from ..suite.model import Invocation, TestCase
from .job import Outcome, WorkerContext


class NotShippable(Exception):
    """The callable cannot be sent to a worker process."""


@dataclass(frozen=True)
class Shipped:
    """A pickled callable and what a worker needs to unpickle it."""

    payload: bytes
    modules: dict[str, str] = field(default_factory=dict)   # module name -> its file
    paths: tuple[str, ...] = ()                             # the sender's sys.path


class _NotingPickler(pickle.Pickler):
    """Pickles as usual, noting the module of every class and function it refers to."""

    def __init__(self, file: io.BytesIO):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.module_names: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)):
            name = getattr(obj, "__module__", None)
            if isinstance(name, str):
                self.module_names.add(name)
                qualname = getattr(obj, "__qualname__", "")
                if "<locals>" in qualname or "<lambda>" in qualname:
                    raise NotShippable(f"{qualname} is defined inside a function; define it at the top "
                                       f"level of {name} so that a worker process can import it")
        return NotImplemented


def ship(obj: Any) -> Shipped:
    """`obj` pickled for a worker; raises NotShippable with the reason when it cannot be."""
    buf = io.BytesIO()
    pickler = _NotingPickler(buf)
    try:
        pickler.dump(obj)
    except NotShippable:
        raise
    except Exception as exc:
        raise NotShippable(f"it cannot be pickled ({type(exc).__name__}: {exc})") from None
    modules = {}
    for name in sorted(pickler.module_names):
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if file and name != "__main__":
            modules[name] = os.path.abspath(file)
    return Shipped(buf.getvalue(), modules, tuple(p for p in sys.path if isinstance(p, str)))


def _same_file(module: types.ModuleType, file: str) -> bool:
    found = getattr(module, "__file__", None)
    if not found:
        return False
    try:
        return os.path.samefile(found, file)
    except OSError:
        return False


def _import(name: str, file: str) -> None:
    """Make sys.modules[name] the module of `file`: by its name when that leads to the
    file, else from the file itself."""
    module = sys.modules.get(name)
    if module is not None and _same_file(module, file):
        return
    if module is None:
        try:
            module = importlib.import_module(name)
        except Exception:
            module = None
        if module is not None and _same_file(module, file):
            return
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {name} from {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, modules: dict[str, str]):
        super().__init__(file)
        self.modules = modules

    def find_class(self, module: str, name: str) -> Any:
        if module in self.modules:
            _import(module, self.modules[module])
        return super().find_class(module, name)


def unship(shipped: Shipped) -> Any:
    """The callable again, in this (worker) process."""
    missing = [p for p in shipped.paths if p not in sys.path]
    sys.path[:0] = missing
    return _Unpickler(io.BytesIO(shipped.payload), shipped.modules).load()


@dataclass
class UserCallJob:
    """Run a shipped callable on `preset` with the invocation's inputs and weights (the
    Task protocol of job.py). `case` names the test (id, spec hash) for the runner and
    the artifact cache; its definition is never built."""

    key: str
    callable: Shipped
    case: TestCase
    invocation: Invocation
    preset: Preset
    repeats: int = 1
    warmup: int = 1
    cache_dir: Path | None = None
    reference: bool = False
    judged: bool = False    # also what check judges with on fp16/bf16 (elementwise reference, control)

    def run(self, context: WorkerContext = WorkerContext()) -> Outcome:
        from .prepare import prepare_call
        from .runner import Job, run_job

        try:
            fn = unship(self.callable)
        except Exception as exc:
            return self.failed(Verdict.EXPORT_FAIL, type(exc).__name__,
                               f"the callable could not be rebuilt in the worker: {error_text(exc)}")
        try:
            state = self.invocation.states.get("a")
            if state is not None:
                fn.load_state_dict(state, strict=True)
            args = copy.deepcopy(list(self.invocation.args))
            kwargs = copy.deepcopy(dict(self.invocation.kwargs))
            prepared = prepare_call({"a": fn}, args, kwargs, f"test '{self.case.id}'")
        except Exception as exc:
            return self.failed(Verdict.EXPORT_FAIL, type(exc).__name__,
                               f"preparing the test failed before export: {error_text(exc)}")
        from .references import REDUCED, needs_control

        reduced = self.judged and self.preset.precision in REDUCED
        job = Job(case=self.case, seed=0, invocation=self.invocation, preset=self.preset,
                  repeats=self.repeats, warmup=self.warmup, cache_dir=self.cache_dir, key=self.key,
                  reference=self.reference, prepared=prepared, elementwise=reduced,
                  control=reduced and needs_control(self.preset))
        return run_job(job, threads=context.threads)

    def failed(self, status: Verdict, error_class: str | None, message: str) -> Outcome:
        return Outcome(self.key, status, error_class=error_class, error_message=message)
