"""The `opdiff_golden` fixture: a module built by the user's own test, checked against a
golden on one or more backends, without a suite.

    def test_block(opdiff_golden):
        torch.manual_seed(0)
        opdiff_golden.check(MyBlock(), (torch.randn(2, 8),), backends=["onnx_cpu_fp32"])

Goldens live in a golden store named `__goldens__` next to the test file, one per call,
keyed by the test's node id (`tests/test_blocks.py::test_block`; `#NAME` is appended
for `check(..., name=NAME)`, `#2`, `#3` for further unnamed calls of one test). Each
holds, as for suite tests, the inputs, the module's weights (state_dict), the
baseline's outputs and their float64 reference.

When the golden is missing, the first run records it on the baseline preset (ini
`opdiff_baseline`, default torch_cpu_fp32) and checks the backends against it; later
runs check against it. A golden is STALE when what it was recorded from changed: its
spec hash covers four parts, kept in its definition so the failure can say which:
the source of every class and function of the call defined outside torch (the module's
class, its submodules' classes, their bases), the module's repr (its configuration),
the inputs and the weights (dtypes, shapes and bytes). `--opdiff-update` re-records
stale goldens and prunes unused ones (`sweep`, at session end).

The module is the user's own object, made in the pytest process; backend runs still
happen in the session's worker processes: the module travels there by value
(execution/user_call.py), where the golden's weights are loaded into it and it runs on
the golden's inputs. A module that cannot be pickled, or whose class is defined inside
a function, fails the test with the reason.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import shlex
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pytest
import torch

from ..backends.base import Preset
from ..compare.results import Result
from ..compare.tolerance import tolerance_for
from ..core import trees
from ..core.errors import OpdiffError
from ..core.safetext import printable, unsafe_char
from ..core.verdicts import Verdict
from ..execution.job import Outcome
from ..execution.user_call import NotShippable, Shipped, UserCallJob, ship
from ..goldens import CorruptGolden, Golden, GoldenInfo, GoldenStore, MissingGolden
from ..run.check_plan import Planned, plan_item
from ..run.judge import Pending, judge
from ..run.record import golden_of
from ..suite.model import Call, Invocation, TestCase, Tolerance
from .outcomes import settle

GOLDENS_DIR = "__goldens__"
SEED = 0
PARTS = {"source": "the source of {classes}", "structure": "the module's configuration (its repr)",
         "inputs": "the inputs", "weights": "the weights (seed the module's construction, e.g. "
                                               "torch.manual_seed, so they are the same every run)"}


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _values_hash(value: Any) -> str:
    """sha256 over a nested value's structure and each tensor's dtype, shape and bytes."""
    structure, leaves = trees.flatten(value)
    h = hashlib.sha256(json.dumps(structure, sort_keys=True).encode())
    for t in leaves:
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(f"\0{t.dtype}{tuple(t.shape)}\0".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _is_torch(obj: Any) -> bool:
    module = getattr(obj, "__module__", "") or ""
    return module in ("builtins", "torch") or module.startswith("torch.")


def _name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def _code_objects(fn: Any) -> list[Any]:
    """The classes and functions whose source decides what `fn` computes, outside torch."""
    found: dict[str, Any] = {}
    roots = list(fn.modules()) if isinstance(fn, torch.nn.Module) else [fn]
    for obj in roots:
        if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
            chain: list[Any] = [obj]
        else:
            cls = obj if isinstance(obj, type) else type(obj)
            chain = list(cls.__mro__)
        for c in chain:
            if c is object or _is_torch(c):
                continue
            found.setdefault(_name(c), c)
    return list(found.values())


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return _name(obj)


@dataclass(frozen=True)
class CallSpec:
    """What a golden of one call was recorded from: the hashes of its four parts."""

    hashes: dict[str, str]
    classes: tuple[str, ...]

    @property
    def spec_hash(self) -> str:
        return _sha(json.dumps(self.hashes, sort_keys=True))

    @classmethod
    def of(cls, fn: Any, args: list[Any], kwargs: dict[str, Any]) -> "CallSpec":
        code = _code_objects(fn)
        sources = {_name(c): _source(c) for c in code}
        is_module = isinstance(fn, torch.nn.Module)
        hashes = {"source": _sha(json.dumps(sources, sort_keys=True)),
                  "structure": _sha(repr(fn) if is_module else _name(fn)),
                  "inputs": _values_hash([list(args), dict(kwargs)]),
                  "weights": _values_hash(dict(fn.state_dict()) if is_module else {})}
        return cls(hashes, tuple(sorted(sources)))

    def changed(self, stored: dict[str, Any]) -> str:
        """What differs from the hashes a golden stored, in words."""
        hashes = stored.get("hashes")
        old = hashes if isinstance(hashes, dict) else {}
        parts = [PARTS[k].format(classes=", ".join(self.classes) or "the callable")
                 for k in PARTS if old.get(k) != self.hashes.get(k)]
        return " and ".join(parts) if parts else "the baseline preset"


def _detached(value: Any) -> Any:
    structure, leaves = trees.flatten(value)
    return trees.unflatten(structure, [t.detach().clone() for t in leaves])


def _fail(message: str) -> None:
    __tracebackhide__ = True
    pytest.fail(f"opdiff_golden: {message}", pytrace=False)


class GoldenFixture:
    """What a test gets as `opdiff_golden`."""

    def __init__(self, run: Any, node: pytest.Item):
        self.run, self.node = run, node
        self._ids: list[str] = []

    @property
    def store(self) -> GoldenStore:
        return GoldenStore(Path(self.node.path).parent / GOLDENS_DIR)

    def _test_id(self, name: str | None) -> str:
        base = self.node.nodeid
        test_id = f"{base}#{name}" if name else (base if not self._ids else f"{base}#{len(self._ids) + 1}")
        if test_id in self._ids:
            _fail(f"check(..., name={name!r}) is used twice in {base}; give each check of one test its own name.")
        if unsafe_char(test_id):
            _fail(f"the golden id '{printable(test_id)}' holds {unsafe_char(test_id)}, a control, bidi or "
                  "line-separator character; give check(..., name=...) and the test's parameters plain text.")
        self._ids.append(test_id)
        return test_id

    def check(self, fn: Any, inputs: Any = (), kwargs: dict[str, Any] | None = None, *,
              backends: Sequence[str] | None = None, name: str | None = None,
              atol: float | None = None, rtol: float | None = None) -> list[Result]:
        """Check `fn(*inputs, **kwargs)` on each backend against its golden (recorded on
        the baseline when there is none). Fails the test with every failing verdict,
        skips it when no backend could run here; returns the results."""
        __tracebackhide__ = True
        if not callable(fn):
            _fail(f"check() needs a torch.nn.Module or a function, not a {type(fn).__name__}.")
        args = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
        kwargs = dict(kwargs or {})
        run = self.run
        test_id = self._test_id(name)
        try:
            presets = [run.preset(p) for p in (backends or run.options.backends or [run.options.baseline])]
            baseline = run.preset(run.options.baseline)
        except OpdiffError as exc:
            _fail(str(exc))
        try:
            spec = CallSpec.of(fn, args, kwargs)
            args, kwargs = _detached(args), _detached(kwargs)
        except TypeError as exc:
            _fail(f"the inputs of {test_id} cannot be stored in a golden: {exc}. Pass tensors, numbers, "
                  "strings, dtypes, None, or lists, tuples and dicts of them.")
        try:
            shipped = ship(fn)
        except NotShippable as exc:
            _fail(f"{_name(fn if not isinstance(fn, torch.nn.Module) else type(fn))} cannot be sent to a "
                  f"worker process: {exc}.")
        file = self.node.nodeid.split("::")[0]
        is_module = isinstance(fn, torch.nn.Module)
        definition = {"pytest": {"node": self.node.nodeid, "name": name, "file": file,
                                 "callable": _name(type(fn) if is_module else fn),
                                 "hashes": spec.hashes, "classes": list(spec.classes)}}
        case = TestCase(id=test_id, suite=Path(file), call=Call("module" if is_module else "op", _name(fn)),
                        inputs=(), kwargs={}, spec_hash=spec.spec_hash, definition=definition)
        store = self.store
        run.used.add((str(store.where()), test_id))
        tol = Tolerance(atol, rtol) if atol is not None or rtol is not None else None
        call = _Call(run, self.node, store, case, shipped, presets, baseline, tol)
        results = call.results(spec, Invocation(args, kwargs, {"a": _detached(dict(fn.state_dict()))}
                                                if is_module else {}))
        for result in results:
            run.emit(result)
        update = f"pytest --opdiff-update {shlex.quote(self.node.nodeid)} (re-records it on {baseline.name})"
        settle(results, {Verdict.STALE: update, Verdict.CORRUPT: update})
        return results


@dataclass
class _Call:
    """One check() call: record when needed, run the backends, judge."""

    run: Any
    node: pytest.Item
    store: GoldenStore
    case: TestCase
    shipped: Shipped
    presets: list[Preset]
    baseline: Preset
    tolerance: Tolerance | None

    def _result(self, preset: Preset, verdict: Verdict, message: str) -> Result:
        return Result.of(self.case, self.case.id, SEED, preset.name, verdict, message, baseline=self.baseline.name)

    def results(self, spec: CallSpec, invocation: Invocation) -> list[Result]:
        """Planned as check plans an item (run/check_plan.py), on the session's baseline:
        a missing golden is recorded, and with --opdiff-update a corrupt or stale one too;
        the messages are the fixture's own."""
        run, store, test_id = self.run, self.store, self.case.id
        planned = plan_item(self.case, SEED, store.info(test_id, SEED), baseline=self.baseline.name)
        info, update = planned.info, run.options.update
        if planned.verdict is Verdict.CORRUPT and info is not None and not update:
            return [self._result(p, Verdict.CORRUPT, f"the golden of {test_id} in {store.root} is unreadable "
                                 f"({info.problem})") for p in self.presets]
        if planned.verdict is Verdict.STALE and info is not None and not update:
            try:
                stored = store.read_definition(test_id, SEED).get("pytest") or {}
            except (CorruptGolden, MissingGolden):
                stored = {}
            what = spec.changed(stored if isinstance(stored, dict) else {})
            if info.baseline != self.baseline.name:
                what = f"the baseline (recorded on {info.baseline}, the session's is {self.baseline.name})"
            message = f"{what} changed since the golden was recorded ({info.created[:19]})"
            run.note("stale goldens (`pytest --opdiff-update` re-records them)", f"{test_id}: {what} changed")
            return [self._result(p, Verdict.STALE, message) for p in self.presets]
        if planned.verdict is not None or info is None:
            return self._record_and_check(invocation, "recorded" if info is None else "re-recorded")
        try:
            golden = store.read(test_id, SEED)
        except (CorruptGolden, MissingGolden) as exc:
            return [self._result(p, Verdict.CORRUPT, exc.reason if isinstance(exc, CorruptGolden) else str(exc))
                    for p in self.presets]
        outcomes = self._run_all(golden.invocation, record=False)
        return [self._judge(golden, info, p, outcomes[p.name]) for p in self.presets]

    def _record_and_check(self, invocation: Invocation, how: str) -> list[Result]:
        outcomes = self._run_all(invocation, record=True)
        recorded = outcomes.pop("\0record")
        if recorded.status is not None:
            why = (f"no golden: recording it on {self.baseline.name} failed: {recorded.status.value}: "
                   f"{recorded.error_message or 'no detail'}")
            return [self._result(p, Verdict.BASELINE_FAIL, why) for p in self.presets]
        golden = self._golden(invocation, recorded)
        try:
            key = self.store.write(golden)
        except (OpdiffError, TypeError, ValueError) as exc:
            return [self._result(p, Verdict.BASELINE_FAIL, f"the golden cannot be stored: {exc}")
                    for p in self.presets]
        self.run.note(f"goldens {how} on {self.baseline.name}", f"{self.case.id} ({self.store.root}/{key})")
        info = GoldenInfo(golden.test_id, SEED, golden.spec_hash, golden.suite, golden.test_type,
                          self.baseline.name, golden.env, golden.created, key)
        # the baseline's result is the recording itself: judging it on the golden it just
        # wrote would only show that it ran twice the same way
        return [self._result(p, Verdict.RECORDED, "").with_outcome(recorded) if p.name == self.baseline.name
                else self._judge(golden, info, p, outcomes[p.name]) for p in self.presets]

    def _run_all(self, invocation: Invocation, record: bool) -> dict[str, Outcome]:
        """Every backend's outcome (and the baseline's recording), run side by side."""
        run, settings = self.run, self.run.settings
        keys: dict[str, str] = {}
        base = f"opdiff_golden\0{self.case.id}\0"

        def submit(label: str, preset: Preset, **kw: Any) -> None:
            key = base + label
            job = UserCallJob(key, self.shipped, self.case, invocation, preset, **kw)
            run.submit(key, lambda: job)
            keys[label] = key

        if record:
            submit("\0record", self.baseline, repeats=1, warmup=0, reference=True)
        for preset in self.presets:
            if record and preset.name == self.baseline.name:
                continue   # the recording is its result
            submit(preset.name, preset, repeats=settings.repeats, warmup=settings.warmup,
                   cache_dir=settings.cache if run.use_cache else None, judged=True)
        return {label: run.wait(key) for label, key in keys.items()}

    def _golden(self, invocation: Invocation, outcome: Outcome) -> Golden:
        return golden_of(self.case, SEED, self.baseline, self.run.dispatcher.pool.environment(), invocation,
                         outcome, grads=False)

    def _judge(self, golden: Golden, info: GoldenInfo, preset: Preset, outcome: Outcome) -> Result:
        tol = tolerance_for(self.case.tolerance, preset, self.tolerance)
        return judge(Pending(Planned(self.case.id, SEED, self.case, info), golden, preset, tol), outcome)


# ---------------------------------------------------------------- session end

def sweep(run: Any) -> None:
    """Report, and with --opdiff-update prune, the goldens of this session's test files
    that no test used: their test is gone, or it passed without the check that made
    them. Only test files collected in this session are looked at; a test that did not
    run here (deselected, failed, on another xdist worker) keeps its goldens."""
    if not run.collected_files:
        return
    config = run.config
    partial = {Path(str(a).split("::")[0]).resolve() for a in config.args if "::" in str(a)}
    filtered = bool(config.getoption("lf", False) or config.getoption("stepwise", False))
    root = Path(config.rootpath)
    for folder in sorted({f.parent for f in run.collected_files}):
        store = GoldenStore(folder / GOLDENS_DIR)
        if not store.exists():
            continue
        for info in store.index():
            if info.problem or (str(store.where()), info.test_id) in run.used:
                continue
            file = (root / info.suite).resolve()
            if file.exists() and file not in run.collected_files:
                continue   # a test file of this folder that this session did not collect
            try:
                stored = store.read_definition(info.test_id, info.seed).get("pytest") or {}
            except (CorruptGolden, MissingGolden):
                continue
            node = stored.get("node") if isinstance(stored, dict) else None
            gone = node not in run.collected_ids and file not in partial and not filtered
            if not (gone or node in run.passed):
                continue
            why = "its test is gone" if gone else "its test passed without this check"
            if run.options.update:
                try:
                    store.delete(info.test_id, info.seed)
                except MissingGolden:
                    continue   # another xdist worker pruned it
                run.note("unused goldens pruned", f"{info.test_id} ({why})")
            else:
                run.note("unused goldens (`pytest --opdiff-update` prunes them)", f"{info.test_id} ({why})")
