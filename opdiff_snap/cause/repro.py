"""Write a standalone Python script that reproduces one (test, seed) on one preset.

The script needs torch and the preset's runtime only, never opdiff_snap: someone attaches
it to an upstream bug report. It carries the stored inputs, weights and expected outputs
(base64 inside the script when small, a .pt file of plain tensors beside it otherwise),
rebuilds the op or module, runs it the way the preset does, prints max_abs / max_rel /
mismatched per output, and exits 1 on a mismatch, 0 when everything matches.

Each backend family provides the part that runs the module its way, as readable source
text (`repro_source`, beside its own export and load code, so the two are read and
changed together), and what the script needs (`repro_needs`). The rest of the script's
fixed text is in cause/repro_templates/; what differs per test (the data, how to build
the call) is generated here (cause/repro_source.py). The text is written out, never run
by this package.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import io
import re
import textwrap
from importlib.resources import files
from pathlib import Path
from typing import Any, Sequence

import torch

from ..backends.base import Preset
from ..backends.registry import backend_for
from ..compare.bounds import BIAS_MIN_ELEMENTS, BIAS_SHIFT, DRIFT_BOUND, DRIFT_CLIP, T_QUANTILE
from ..compare.leaf_verdict import leaf_rules
from ..compare.rules import Rounding
from ..core.errors import OpdiffError
from ..core.safetext import printable
from ..core.trees import flatten
from ..core.verdicts import Verdict as V
from ..goldens.golden import Golden
from ..suite import dynamic
from ..suite.model import Invocation, TestCase, Tolerance
from . import repro_templates
from .repro_source import CaseSource, literal, tuple_source

SCRIPT_VERDICTS = "".join(f"{v.value} = {v.value!r}\n" for v in (   # the verdicts a script can reach
    V.PASS, V.MISMATCH, V.SHAPE_MISMATCH, V.STRUCTURE_MISMATCH, V.EXPORT_FAIL, V.LOAD_FAIL, V.INFER_FAIL))

# the bias bound's parameters, written into every script (compare/bounds.py)
BIAS_CONSTANTS = {"BIAS_MIN_ELEMENTS": BIAS_MIN_ELEMENTS, "BIAS_SHIFT": BIAS_SHIFT, "DRIFT_CLIP": DRIFT_CLIP,
                  "DRIFT_BOUND": DRIFT_BOUND, "T_QUANTILE": T_QUANTILE}

EMBED_LIMIT = 256 * 1024  # bytes of torch.save data embedded in the script; larger goes beside it


# in a template file, the line after which its text is the script's
SCRIPT_TEXT = "# ---------------------------------------------------------------- script text\n"


@functools.cache
def template(name: str) -> str:
    """The script text of cause/repro_templates/`name`.py."""
    text = files(repro_templates).joinpath(f"{name}.py").read_text(encoding="utf-8")
    return text.split(SCRIPT_TEXT, 1)[1]


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().clone().contiguous()


def _expected_leaves(outputs: Any) -> list[torch.Tensor]:
    _, leaves = flatten(outputs)
    return [_plain(torch.view_as_real(t) if t.is_complex() else t) for t in leaves]


def _runner(preset: Preset) -> tuple[str, str]:
    """The backend family's repro code and what it needs. The code defines `export(module,
    inputs) -> artifact` and `load(artifact) -> run(inputs)`, the steps of the Backend
    protocol, so the script tells an export failure from a load or an inference one; a
    family that writes only `run(module, inputs)` gets the two wrapped around it."""
    backend = backend_for(preset)
    if backend.quantizes(preset):
        raise OpdiffError(f"preset '{preset.name}' quantizes: a repro script runs the float export only, and "
                          "would not reproduce its int8 result. Its history row holds both errors "
                          "(quant_sqnr, lowering_steps); check it again with --test-ids to rerun it.")
    runner, needs = backend.repro_source, backend.repro_needs
    if not runner:
        raise OpdiffError(f"backend family '{preset.family}' (preset '{preset.name}') provides no repro "
                          "template (its `repro_source`); a repro script cannot be written for it.")
    if not re.search(r"^def export\(", runner, re.M):
        runner = runner.rstrip("\n") + "\n" + template("run_only")
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
    """`make_args(t)`, the call's arguments from the tensor inputs, then the `Flat` module."""
    return ("\n\ndef make_args(t):\n"
            '    """(args, kwargs) of the call, tensor inputs t[i] in place."""\n'
            f"    return {call_args}\n" + template("flat"))


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
    text = (header + imports + user + consts + template("common") + "\n" + runner.lstrip("\n")
            + "\n\n" + _data_source(out_path, data) + "\n\n" + build_src + flat_src
            + template("compare") + template("main"))
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

def write_repro(case: TestCase, golden: Golden | tuple[Invocation, Any], preset: Preset, out_path: Path,
                tolerance: Tolerance, seed: int | None = None, rounding: Rounding | None = None) -> Path:
    """Write the repro script to `out_path` and return it.

    `golden` is a Golden (its .invocation and .outputs are used) or a pair
    (invocation, expected outputs). Pair tests reproduce side a against the expected outputs.
    `rounding` is what check judges with (the golden's float64 reference, the precisions,
    the elementwise reference); the script then decides exactly as check does.
    """
    if case.dynamic is not None:
        raise OpdiffError(f"test '{case.id}' is a sized test (dynamic shapes): its check exports one artifact for "
                          "every size, and a repro script exports for the static shapes of its inputs, so it would "
                          "not reproduce that export. Rerun it with `opdiff check --test-ids "
                          f"'{dynamic.seed_id(case.id, case.definition)}@*'`.")
    if isinstance(golden, Golden):
        invocation, outputs, seed = golden.invocation, golden.outputs, golden.seed
    else:
        invocation, outputs = golden
    if case.pair is not None and isinstance(outputs, dict) and "a" in outputs:
        outputs = outputs["a"]  # a pair golden holds both sides; the script reproduces side a
        if rounding is not None:
            rounding = dataclasses.replace(rounding, residuals=_side_a(rounding.residuals),
                                           elementwise=_side_a(rounding.elementwise),
                                           control=_side_a(rounding.control))
    _runner(preset)
    _check_tolerance(tolerance)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    src = CaseSource(case, out_path.parent)

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
        flat_src += template("complex_input")
    return _write_script(out_path, docstring, preset, tolerance, data, build_src, flat_src, src.imports)

# ---------------------------------------------------------------- one ATen node (or a range of them)

def write_node_repro(case: TestCase, graph: Any, start: int, stop: int, preset: Preset, out_path: Path,
                     tolerance: Tolerance, seed: int = 0) -> Path:
    """A script for ATen nodes start..stop of a scope's graph (execution.atengraph.NodeGraph): a
    module whose forward is the one op call (or the range's code, as FX writes it), with
    what they read from weights and constants as buffers, as in the model. It runs on the
    intermediate values the baseline computed for their inputs and compares with what the
    baseline computed for their outputs."""
    from ..execution.atengraph import Ref

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
            return tuple_source([source(x) for x in template])
        if isinstance(template, dict):
            return "{" + ", ".join(f"{k!r}: {source(v)}" for k, v in template.items()) + "}"
        return literal(template)

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
