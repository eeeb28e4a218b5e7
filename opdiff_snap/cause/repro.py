"""Write a standalone Python script that reproduces one (test, seed) on one preset.

The script needs torch and the preset's runtime only, never opdiff_snap: someone attaches
it to an upstream bug report. It carries the stored inputs, weights and expected outputs
(base64 inside the script when small, a .pt file of plain tensors beside it otherwise),
rebuilds the op or module, runs it the way the preset does, prints max_abs / max_rel /
mismatched per output, and exits 1 on a mismatch, 0 when everything matches.

Each backend family provides the part that runs the module its way, as readable source
text (`repro_source`, beside its own export and load code, so the two are read and
changed together), and what the script needs (`repro_needs`). The text is written out,
never run by this package.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math
import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any, Sequence

import torch

from ..backends.base import Preset
from ..backends.registry import backend_for
from ..compare.bounds import BIAS_MIN_ELEMENTS, BIAS_SHIFT, DRIFT_BOUND, DRIFT_CLIP, T_QUANTILE
from ..compare.leaves import leaf_rules
from ..compare.rules import Rounding
from ..core.errors import OpdiffError
from ..core.safetext import printable
from ..core.trees import flatten
from ..core.verdicts import Verdict as V
from ..suite.construct import split_file_path
from ..suite.locate import package_files
from ..suite.model import Node, TestCase, Tolerance

SCRIPT_VERDICTS = "".join(f"{v.value} = {v.value!r}\n" for v in (   # the verdicts a script can reach
    V.PASS, V.MISMATCH, V.SHAPE_MISMATCH, V.STRUCTURE_MISMATCH, V.EXPORT_FAIL, V.LOAD_FAIL, V.INFER_FAIL))

# the bias bound's parameters, written into every script (compare/bounds.py)
BIAS_CONSTANTS = {"BIAS_MIN_ELEMENTS": BIAS_MIN_ELEMENTS, "BIAS_SHIFT": BIAS_SHIFT, "DRIFT_CLIP": DRIFT_CLIP,
                  "DRIFT_BOUND": DRIFT_BOUND, "T_QUANTILE": T_QUANTILE}

EMBED_LIMIT = 256 * 1024  # bytes of torch.save data embedded in the script; larger goes beside it


_COMMON = '''
DTYPE = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[PRESET["precision"]]
DEVICE = {"gpu": "cuda"}.get(PRESET["device"], PRESET["device"])


def cast(x):
    """A reduced-precision preset casts real floating tensors to its dtype; fp32 keeps them."""
    return x.to(DTYPE) if PRESET["precision"] != "fp32" and x.is_floating_point() else x


def cast_module(module):
    for t in list(module.parameters()) + list(module.buffers()):
        t.data = cast(t.data)
    return module
'''


_COMPARE_AND_MAIN = '''

def flatten(out):
    """Output tensors in order (tuples, lists and dict values walked, and the children of a
    type registered with torch.utils._pytree); complex as real [..., 2]."""
    if isinstance(out, torch.Tensor):
        return [torch.view_as_real(out) if out.is_complex() else out]
    if isinstance(out, dict):
        out = list(out.values())
    elif not isinstance(out, (tuple, list)) and type(out) in torch.utils._pytree.SUPPORTED_NODES:
        out = torch.utils._pytree.SUPPORTED_NODES[type(out)].flatten_fn(out)[0]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flatten(o)]
    return []


def ulps(values, u, tiny):
    """One unit in the last place at each value, for a precision of unit roundoff u."""
    _, exponent = torch.frexp(values.abs().clamp_min(tiny))
    return torch.ldexp(torch.full_like(values, u), exponent)


def bands(rule, e):
    """(centre, width) pairs: an element passes when |actual - centre| <= width for any."""
    tol = lambda c: rule["atol"] + rule["rtol"] * c.abs()  # noqa: E731
    if rule["kind"] == "elementwise":
        r = rule["reference"]
        allowed = rule["ulps"] * ulps(r, rule["u"], rule["tiny"])
        allowed = torch.where(r.abs() < rule["tiny"], allowed.clamp_min(rule["tiny"]), allowed)
        return [(r, allowed), (e, torch.full_like(e, rule["atol"]))]
    out = [(e, tol(e))]
    if rule["bound"] is not None and rule["reference"] is not None:
        out += [(e, torch.full_like(e, rule["bound"])), (rule["reference"], tol(rule["reference"]))]
    return out


def blocks_of(n, row):
    """Index blocks for batch means: the rows of the last dimension (4 to 32 of them, consecutive
    rows merged), or 4 contiguous chunks when there are fewer than 4 rows."""
    rows = n // row if row > 0 else 0
    if rows < 4 or rows * row != n:
        return list(torch.tensor_split(torch.arange(n), 4))
    return [g.reshape(-1) for g in torch.tensor_split(torch.arange(n).reshape(rows, row), min(rows, 32))]


def mean_and_bound(x, floor, blocks):
    """The mean over the blocks' elements, and what it may be: the floor, or T_QUANTILE standard
    errors of it by the block means when larger."""
    blocks = [b for b in blocks if b.numel()]
    means = torch.stack([x[b].mean() for b in blocks])
    spread = means.std(correction=1).item() / math.sqrt(len(blocks))
    return x[torch.cat(blocks)].mean().item(), max(floor, T_QUANTILE[len(blocks) - 4] * spread)


def biased(rule, e, a, row):
    """Whether the errors point one way (the bias bound): the mean error, and the mean error in
    ulps toward +inf and away from zero, each within its bound."""
    centre = {"expected": e, "reference": rule["reference"], "own": rule["bias_centre"]}.get(rule["bias_on"])
    if centre is None:
        return False
    usable = torch.isfinite(a) & torch.isfinite(centre)
    a, centre = a[usable], centre[usable]
    n = a.numel()
    if n < BIAS_MIN_ELEMENTS:
        return False
    magnitude = centre.abs().max().item()
    if magnitude == 0.0 or not math.isfinite(magnitude):
        return False
    diff, k = a - centre, rule["kernel_ulps"]
    shrunk = torch.sign(diff) * (diff.abs() - rule["atol"]).clamp_min(0.0)
    shift, shift_bound = mean_and_bound(shrunk, BIAS_SHIFT * k * rule["u"] * magnitude, blocks_of(n, row))
    if abs(shift) > shift_bound:
        return True
    unit = ulps(centre, rule["u"], rule["tiny"])
    seen = unit > rule["atol"]          # the mean error in ulps, where the tolerance resolves an ulp
    if int(seen.sum()) < BIAS_MIN_ELEMENTS:
        return False
    z = (diff / unit).clamp(-DRIFT_CLIP, DRIFT_CLIP)
    blocks = [b[seen[b]] for b in blocks_of(n, row)]
    if sum(1 for b in blocks if b.numel()) < 4:
        return False
    up, up_bound = mean_and_bound(z, DRIFT_BOUND * k, blocks)
    out, out_bound = mean_and_bound(z * torch.sign(centre), DRIFT_BOUND * k, blocks)
    return max(abs(up) / up_bound, abs(out) / out_bound) > 1.0


def compare(expected, actual, rules):
    """Print per-output metrics; return the verdict and the metrics over all outputs together,
    judged exactly as `opdiff check` judges them (docs/check.md, "When a result passes"): each
    element within one of its bands (the tolerance, the rounding bound, the float64 reference;
    or for one elementwise op on fp16/bf16 a few ulps of the exact answer), NaN and Inf at the
    same places, integers and bools equal, and no bias."""
    if len(actual) != len(expected):
        print(f"{MISMATCH}: {len(actual)} outputs, expected {len(expected)}")
        return STRUCTURE_MISMATCH, None
    verdict = PASS
    total = {"max_abs": 0.0, "max_rel": 0.0, "mean_abs": 0.0, "mismatched": 0, "numel": 0, "failed_bound": None}
    sum_abs, counted = 0.0, 0
    for i, (e, a, rule) in enumerate(zip(expected, actual, rules)):
        a = a.detach().cpu()
        if tuple(a.shape) != tuple(e.shape):
            print(f"output {i}: {MISMATCH} shape {tuple(a.shape)}, expected {tuple(e.shape)}")
            verdict = SHAPE_MISMATCH
            continue
        ef, af = e.double().reshape(-1), a.to(e.dtype).double().reshape(-1)
        finite = torch.isfinite(ef) & torch.isfinite(af)
        if rule is None:                              # integers, bools: exact
            bad, failed = e.reshape(-1) != a.to(e.dtype).reshape(-1), "exact"
        else:
            excess = None
            for centre, width in bands(rule, ef):
                x = (af - centre).abs() - width
                excess = x if excess is None else torch.minimum(excess, x)
            en, an = torch.isnan(ef), torch.isnan(af)
            nonfinite = (en != an) | (~finite & ~en & ~an & (ef != af))
            bad = nonfinite | (finite & (excess > 0))
            failed = "nonfinite" if bool(nonfinite.any()) else rule["kind"]
            if not bool(bad.any()) and rule["bias_on"] is not None and \
                    biased(rule, ef, af, e.shape[-1] if e.dim() else 1):
                failed = "bias"
        if e.dim() and e.shape[-1] == 2 and rule is not None and rule.get("complex"):
            bad = bad.reshape(-1, 2).any(dim=1)
        diff, size = (af - ef).abs()[finite], ef.abs()[finite]
        rel = diff[size > 0] / size[size > 0]
        max_abs = float(diff.max()) if diff.numel() else 0.0
        max_rel = float(rel.max()) if rel.numel() else 0.0
        n_bad = int(bad.sum())
        print(f"output {i}: {e.dtype} shape {tuple(e.shape)} max_abs={max_abs:.6g} max_rel={max_rel:.6g} "
              f"mismatched={n_bad}/{bad.numel()}" + (f" ({failed} bound)" if n_bad or failed == "bias" else ""))
        total["max_abs"], total["max_rel"] = max(total["max_abs"], max_abs), max(total["max_rel"], max_rel)
        total["mismatched"] += n_bad
        total["numel"] += bad.numel()
        sum_abs, counted = sum_abs + float(diff.sum()), counted + diff.numel()
        if (n_bad or failed == "bias") and verdict == PASS:
            verdict, total["failed_bound"] = MISMATCH, failed
    total["mean_abs"] = sum_abs / counted if counted else 0.0
    return verdict, total


def failed(verdict, exc):
    """A step of the backend raised: the traceback, then the verdict `opdiff check` gives it."""
    traceback.print_exception(exc)
    print(verdict)
    print(json.dumps({"verdict": verdict, "error": f"{type(exc).__name__}: {exc}"}))
    return 1


def main():
    """Export, load and run as the preset does, then compare. The last line printed is
    JSON: {"verdict": ..., "metrics": {...}} (or "error" when a step failed)."""
    data = load_data()
    module = Flat(build(data)).eval()
    inputs = data["inputs"]
    try:
        artifact = export(module, inputs)
    except Exception as exc:
        return failed(EXPORT_FAIL, exc)
    try:
        runnable = load(artifact)
    except Exception as exc:
        return failed(LOAD_FAIL, exc)
    try:
        actual = list(runnable(inputs))
    except Exception as exc:
        return failed(INFER_FAIL, exc)
    verdict, metrics = compare(data["expected"], actual, data["rules"])
    print(verdict)
    print(json.dumps({"verdict": verdict, "metrics": metrics}))
    return 0 if verdict == PASS else 1


if __name__ == "__main__":
    sys.exit(main())
'''


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _tuple(parts: list[str]) -> str:
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


class _Source:
    """Renders stored values and constructor nodes as Python source, collecting imports."""

    def __init__(self, case: TestCase, out_dir: Path):
        self.case, self.out_dir = case, out_dir
        self.imports: list[str] = []
        self.copied: list[Path] = []

    def _add(self, line: str) -> None:
        if line not in self.imports:
            self.imports.append(line)

    def value(self, s: Any) -> str:
        """A trees structure node; tensor leaves become t[i]."""
        ((kind, v),) = s.items()
        if kind == "tensor":
            return f"t[{v}]"
        if kind == "tuple":
            return _tuple([self.value(e) for e in v])
        if kind == "list":
            return "[" + ", ".join(self.value(e) for e in v) + "]"
        if kind == "dict":
            return "{" + ", ".join(f"{k!r}: {self.value(e)}" for k, e in v) + "}"
        if kind == "dtype":
            return f"torch.{v}"
        if kind == "float":
            return f"float({v!r})"
        return repr(v)

    def node(self, n: Node) -> str:
        """A constructor argument node."""
        kind = n.get("type")
        if kind == "const":
            return repr(n["value"])
        if kind == "int_list":
            return repr(list(n["elems"]))
        if kind == "tuple":
            return _tuple([self.node(e) for e in n["elems"]])
        if kind in ("construct", "module"):
            return self.constructor(n["path"], n.get("args", []), n.get("kwargs", {}), n.get("config"))
        raise OpdiffError(f"test '{self.case.id}': cannot write a repro for a module whose constructor "
                          f"takes a sampled '{kind}' value; reproduce it with `opdiff check` instead.")

    def constructor(self, path: str, args, kwargs, config=None) -> str:
        """`path(*args, **kwargs)`, or with a config `path(path.config_class(**config), ...)`."""
        name = self.import_name(path)
        parts = [self.node(a) for a in args] + [f"{k}={self.node(v)}" for k, v in kwargs.items()]
        if config is not None:
            parts.insert(0, f"{name}.config_class(**{dict(config)!r})")
        return f"{name}({', '.join(parts)})"

    def import_name(self, path: str) -> str:
        if path.startswith("file:"):
            rel, name = split_file_path(path)
            src = (self.case.suite_dir / rel).resolve()
            stem = re.sub(r"\W", "_", src.stem)
            if not stem.isidentifier() or stem in sys.stdlib_module_names or stem in ("torch", "repro"):
                stem = f"user_{stem}"
            dest = self.out_dir / f"{stem}.py"
            if src != dest.resolve():
                shutil.copyfile(src, dest)
            self.copied.append(dest)
            self._add("sys.path.insert(0, str(HERE))  # the test's own module file, copied beside this script")
            self._add(f"from {stem} import {name}")
            return name
        if not _DOTTED.fullmatch(path):
            raise OpdiffError(f"test '{self.case.id}': '{path}' is not a dotted import path; no repro "
                              "script is written for it.")
        module_name, _, attr = path.rpartition(".")
        if package_files(module_name) or module_name.split(".")[0] == "torch":
            self._add(f"from {module_name} import {attr}")   # a module: import the name from it
            return attr
        head = module_name.split(".")[0]                     # a class attribute path: import its package
        self._add(f"import {head}")
        return path


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().clone().contiguous()


def _expected_leaves(outputs: Any) -> list[torch.Tensor]:
    _, leaves = flatten(outputs)
    return [_plain(torch.view_as_real(t) if t.is_complex() else t) for t in leaves]


_RUN_ONLY = '''

def export(module, inputs):
    """This family's code is one run(): export and load happen inside it."""
    return module


def load(module):
    return lambda inputs: run(module, inputs)
'''


def _runner(preset: Preset) -> tuple[str, str]:
    """The backend family's repro code and what it needs. The code defines `export(module,
    inputs) -> artifact` and `load(artifact) -> run(inputs)`, the steps of the Backend
    protocol, so the script tells an export failure from a load or an inference one; a
    family that writes only `run(module, inputs)` gets the two wrapped around it."""
    backend = backend_for(preset)
    runner, needs = getattr(backend, "repro_source", None), getattr(backend, "repro_needs", "")
    if not runner:
        raise OpdiffError(f"backend family '{preset.family}' (preset '{preset.name}') provides no repro "
                          "template (its `repro_source`); a repro script cannot be written for it.")
    if not re.search(r"^def export\(", runner, re.M):
        runner = runner.rstrip("\n") + "\n" + _RUN_ONLY
    return runner, needs


def _check_tolerance(tolerance: Tolerance) -> None:
    if tolerance.atol is None or tolerance.rtol is None:
        raise OpdiffError("a repro script needs a resolved tolerance (both atol and rtol); use "
                          "compare.tolerance_for(case, preset, None).")


def _data_source(out_path: Path, data: dict[str, Any]) -> str:
    """`load_data()`: the script's tensors, embedded (base64) when small, else beside it."""
    buf = io.BytesIO()
    torch.save(data, buf)
    raw = buf.getvalue()
    if len(raw) <= EMBED_LIMIT:
        b64 = base64.b64encode(raw).decode()
        lines = "\n".join(f'    "{chunk}"' for chunk in textwrap.wrap(b64, 96))
        return ("# inputs, module state and expected outputs, torch.save'd and base64-encoded\n"
                f"DATA_B64 = (\n{lines}\n)\n\n\n"
                "def load_data():\n"
                "    return torch.load(io.BytesIO(base64.b64decode(DATA_B64)), weights_only=True)\n")
    data_file = out_path.with_name(out_path.stem + "_data.pt")
    data_file.write_bytes(raw)
    return ("# inputs, module state and expected outputs (plain tensors), saved beside this script\n"
            f"DATA_FILE = HERE / {data_file.name!r}\n\n\n"
            "def load_data():\n"
            "    return torch.load(DATA_FILE, weights_only=True)\n")


def _flat_source(call_args: str) -> str:
    return textwrap.dedent(f'''

        def make_args(t):
            """(args, kwargs) of the call, tensor inputs t[i] in place."""
            return {call_args}


        class Flat(torch.nn.Module):
            """The call as a module taking only tensors and returning a flat tuple of tensors."""

            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, *t):
                args, kwargs = make_args(t)
                return tuple(flatten(self.inner(*args, **kwargs)))
        ''')


def _write_script(out_path: Path, docstring: str, preset: Preset, tolerance: Tolerance, data: dict[str, Any],
                  build_src: str, flat_src: str, user_imports: Sequence[str] = ()) -> Path:
    """Assemble a repro script: header, imports, constants, the family's runner, the data,
    how to build the callable, the flat wrapper, compare and main."""
    runner, needs = _runner(preset)
    # the docstring names the test, whose id comes from the golden: nothing in it may end the
    # string literal (a quote) or make the file unreadable (a NUL, a lone surrogate)
    docstring = printable(docstring, lines=True).replace("\\", "\\\\").replace('"', '\\"')
    header = ('#!/usr/bin/env python3\n"""' + docstring.strip() + "\n\n"
              f"Needs only: {needs}. Written by opdiff-snap with torch {torch.__version__}.\n" + '"""\n')
    imports = ("import base64\nimport io\nimport json\nimport math\nimport sys\nimport traceback\n"
               "from pathlib import Path\n\nimport torch\n\n"
               "HERE = Path(__file__).resolve().parent\n")
    consts = (f"\nATOL = {tolerance.atol!r}\nRTOL = {tolerance.rtol!r}\n"
              f"PRESET = {preset.to_json()!r}\n" + SCRIPT_VERDICTS + "".join(
                  f"{name} = {value!r}\n" for name, value in BIAS_CONSTANTS.items()))
    user = ("\n".join(user_imports) + "\n") if user_imports else ""
    text = (header + imports + user + consts + _COMMON + "\n" + runner.lstrip("\n")
            + "\n\n" + _data_source(out_path, data) + "\n\n" + build_src + flat_src + _COMPARE_AND_MAIN)
    out_path.write_text(text)
    return out_path


def script_rules(outputs: Any, tolerance: Tolerance, rounding: Rounding | None) -> list[dict | None]:
    """The judge of check for each expected leaf, as data a script rebuilds it from."""
    rules = []
    _, leaves = flatten(outputs)
    for leaf, rule in zip(leaves, leaf_rules(outputs, tolerance, rounding)):
        rules.append(None if rule is None else {**rule.to_script(), "complex": leaf.is_complex()})
    return rules


def _side_a(tree: Any) -> Any:
    return tree["a"] if isinstance(tree, dict) and "a" in tree else None


def write_repro(case: TestCase, golden: Any, preset: Preset, out_path: Path,
                tolerance: Tolerance, seed: int | None = None, rounding: Rounding | None = None) -> Path:
    """Write the repro script to `out_path` and return it.

    `golden` is a Golden (its .invocation and .outputs are used) or a pair
    (invocation, expected outputs). Pair tests reproduce side a against the expected outputs.
    `rounding` is what check judges with (the golden's float64 reference, the precisions,
    the elementwise reference); the script then decides exactly as check does.
    """
    invocation, outputs = (golden.invocation, golden.outputs) if hasattr(golden, "invocation") else golden
    seed = getattr(golden, "seed", seed)
    if case.pair is not None and isinstance(outputs, dict) and "a" in outputs:
        outputs = outputs["a"]  # a pair golden holds both sides; the script reproduces side a
        if rounding is not None:
            rounding = dataclasses.replace(rounding, residuals=_side_a(rounding.residuals),
                                           elementwise=_side_a(rounding.elementwise))
    _runner(preset)
    _check_tolerance(tolerance)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    src = _Source(case, out_path.parent)

    try:
        structure, leaves = flatten((list(invocation.args), dict(invocation.kwargs)))
    except TypeError as exc:
        raise OpdiffError(f"test '{case.id}': an input cannot be written into a repro ({exc}).") from None
    call_args = src.value(structure)
    if case.cast_input0_to_complex:
        call_args = f"as_complex0({call_args})"

    call = case.call
    state = {}
    if call.kind == "op":
        op = call.target.split("::", 1)
        overload = op[1] if "." in op[1] else op[1] + ".default"
        build_src = (f"OP = torch.ops.{op[0]}.{overload}\n\n\n"
                     "def build(data):\n    return OP\n")
    else:
        ctor = src.constructor(call.target, call.args, call.kwargs, call.config)
        state = {k: _plain(v) for k, v in invocation.states.get("a", {}).items()}
        build_src = ("def build(data):\n"
                     f"    module = {ctor}\n"
                     "    module.load_state_dict(data[\"state\"])\n"
                     "    return module.eval()\n")

    data = {"inputs": [_plain(t) for t in leaves], "state": state, "expected": _expected_leaves(outputs),
            "rules": script_rules(outputs, tolerance, rounding)}
    what = f"op {call.target}" if call.kind == "op" else f"module {call.target}"
    docstring = (f"Reproducer: test {case.id!r}{'' if seed is None else f' seed {seed}'} on preset "
                 f"{preset.name!r}.\n\n"
                 f"Calls {what} on the recorded inputs{' with the recorded weights' if state else ''},\n"
                 f"runs it on {preset.family} ({preset.device}, {preset.precision}) and compares with the outputs\n"
                 "recorded on the baseline, judged as `opdiff check` judges them.\n"
                 "Exit status: 0 when every output matches, 1 on a mismatch.")
    flat_src = _flat_source(call_args)
    if case.cast_input0_to_complex:
        flat_src += textwrap.dedent('''

            def as_complex0(args_kwargs):
                """Input 0 travels as real [..., 2] and is rebuilt as complex."""
                args, kwargs = args_kwargs
                if not args[0].is_complex():
                    args[0] = torch.view_as_complex(args[0])
                return args, kwargs
            ''')
    return _write_script(out_path, docstring, preset, tolerance, data, build_src, flat_src, src.imports)


# ---------------------------------------------------------------- one ATen node (or a range of them)

def _literal(v: Any) -> str:
    """A constant of an ATen node's arguments as Python source."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return repr(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else f"float({str(v)!r})"
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    if isinstance(v, tuple):
        return _tuple([_literal(x) for x in v])
    raise OpdiffError(f"an argument of type {type(v).__name__} ({v!r}) cannot be written into a repro script.")


def parse_node_range(text: str, count: int | None = None, where: str = "") -> tuple[int, int]:
    """`--node N` or `--node N-M` (inclusive); with `count`, checked against a graph of
    that many nodes (`where` names it)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text or "")
    if not m:
        raise OpdiffError(f"--node '{text}': give a node number, or a range like 5-7, as `opdiff localize` "
                          "prints them.")
    start, stop = int(m[1]), int(m[2] if m[2] is not None else m[1])
    if start > stop:
        raise OpdiffError(f"--node '{text}': a range goes from the lower number to the higher, like "
                          f"{stop}-{start}.")
    if count is not None and stop >= count:
        raise OpdiffError(f"--node '{text}': {where} has {count} ATen nodes, numbered 0-{count - 1}. "
                          "`opdiff localize ... --ops` lists them.")
    return start, stop


def write_node_repro(case: TestCase, graph: Any, start: int, stop: int, preset: Preset, out_path: Path,
                     tolerance: Tolerance, seed: int = 0) -> Path:
    """A script for ATen nodes start..stop of a scope's graph (cause.atengraph.NodeGraph): a
    module whose forward is the one op call (or the range's code, as FX writes it), with
    what they read from weights and constants as buffers, as in the model. It runs on the
    intermediate values the baseline computed for their inputs and compares with what the
    baseline computed for their outputs."""
    from .atengraph import Ref

    _runner(preset)
    _check_tolerance(tolerance)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    frag = graph.fragment(start, stop)
    if not all(isinstance(v, torch.Tensor) for v in frag.input_values):
        raise OpdiffError(f"test '{case.id}' {frag.label}: a value it reads is not a tensor; it cannot be "
                          "written into a repro script.")
    slot: dict[Any, str] = {r: f"self.{name}" for r, name in frag.buffer_names().items()}
    acts = [r for r, constant in zip(frag.inputs, frag.constant_inputs) if not constant]
    slot.update({r: f"t[{i}]" for i, r in enumerate(acts)})

    def source(template: Any) -> str:
        if isinstance(template, Ref):
            return slot[template]
        if isinstance(template, list):
            return "[" + ", ".join(source(x) for x in template) + "]"
        if isinstance(template, tuple):
            return _tuple([source(x) for x in template])
        if isinstance(template, dict):
            return "{" + ", ".join(f"{k!r}: {source(v)}" for k, v in template.items()) + "}"
        return _literal(template)

    init = ("    def __init__(self, state):\n"
            "        super().__init__()\n"
            "        for name, value in state.items():   # weights, and values computed from them only\n"
            "            self.register_buffer(name, value)\n\n")
    lines = list(dict.fromkeys(f"{n.source_path}  ({n.source})" for n in frag.nodes if n.source))
    if len(frag.nodes) == 1 and frag.outputs == [Ref(frag.nodes[0].name)]:
        node = frag.nodes[0]
        what = f"ATen node {start}, {node.target}"
        call = ", ".join([source(a) for a in node.args] + [f"{k}={source(v)}" for k, v in node.kwargs.items()])
        build_src = (f"OP = torch.ops.{node.op.replace('::', '.')}.{node.overload}\n\n\n"
                     "class Node(torch.nn.Module):\n"
                     f'    """{what} of the model, alone."""\n\n' + init +
                     "    def forward(self, *t):\n"
                     f"        return OP({call})\n")
    else:
        what = f"ATen nodes {start}-{stop} ({' -> '.join(n.target for n in frag.nodes)})"
        code = frag.module().code.strip()
        build_src = ("from torch import device  # noqa: F401  (FX writes devices as device(type=...))\n"
                     "inf, nan = float(\"inf\"), float(\"nan\")\n\n\n"
                     "class Node(torch.nn.Module):\n"
                     f'    """{what}, as torch.export and the default decompositions wrote them."""\n\n'
                     + init + textwrap.indent(code, "    ") + "\n")
    build_src += "\n\ndef build(data):\n    return Node(data[\"state\"])\n"
    data = {"inputs": [_plain(v) for v in frag.activations],
            "state": {name: _plain(v) for name, v in frag.buffers().items()},
            "expected": [_plain(t) for t in frag.expected],
            "rules": script_rules(list(frag.expected), tolerance, Rounding(None, "fp32", preset.precision))}
    scope = graph.scope or "<root>"
    docstring = (f"Reproducer: {what} of test {case.id!r} seed {seed}\n"
                 f"(scope {scope!r}, exported to core ATen) on preset {preset.name!r}.\n\n"
                 + ("From:\n" + "\n".join(f"    {ln}" for ln in lines) + "\n\n" if lines else "")
                 + f"Runs it on {preset.family} ({preset.device}, {preset.precision}) on the intermediate values "
                 "the baseline computed\nfor its inputs and compares with what the baseline computed for its "
                 "outputs, judged by\nthe tolerance and the bias bound of `opdiff check` (no float64 reference "
                 "here).\nExit status: 0 when every output matches, 1 on a mismatch.")
    return _write_script(out_path, docstring, preset, tolerance, data, build_src, _flat_source("(list(t), {})"))
