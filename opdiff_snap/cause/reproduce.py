"""`opdiff repro`: from a stored golden to a standalone script (cause/repro.py) that
reproduces it on a preset, judged as check judges it; or, with `--node`, ATen nodes of a
module test alone, on the intermediate values the baseline computes for them."""

from __future__ import annotations

import re
from pathlib import Path

from ..backends.base import Preset
from ..backends.registry import get_preset
from ..compare.rounding import rounding_for
from ..compare.rules import Rounding
from ..compare.tolerance import tolerance_for
from ..core.errors import OpdiffError
from ..execution.pools import run_one
from ..execution.references import REDUCED, ReferencesTask
from ..goldens.golden import Golden
from ..suite.model import TestCase
from .calls import ScopeGraphTask
from .repro import write_node_repro, write_repro
from .stored import golden_case


def reproduce(test_id: str, backend: str, out: Path, *, seed: int = 0, preset_options=None,
              goldens: Path | str = Path("goldens"), trust_goldens: bool = False, node: str | None = None,
              scope: str = "", timeout_s: float = 300.0, in_process: bool = False,
              suites: Path | str = Path("suites")) -> Path:
    """Write the script for `test_id` on `backend` to `out` and return its path. `node`
    ("N" or "N-M", as localize names them): those ATen nodes of `scope` ("" for the module
    itself, "name" or "name#k" for a submodule call) instead; the graph and its values are
    recorded in a worker, as is the elementwise reference check judges fp16/bf16 with."""
    case, golden = golden_case(test_id, seed, goldens, trust_goldens, suites)
    preset = get_preset(backend, preset_options)
    tol = tolerance_for(case.tolerance, preset)
    if node is None:
        if scope:
            raise OpdiffError(f"--scope '{scope}' names a submodule whose ATen nodes to reproduce; give "
                              "--node too (as `opdiff localize` prints it).")
        return write_repro(case, golden, preset, out, tol, rounding=check_rounding(case, golden, preset, timeout_s,
                                                                                   in_process))
    if case.test_type != "module":
        raise OpdiffError(f"test '{test_id}' is a{'n op' if case.test_type == 'op' else ' pair'} test; --node "
                          "picks ATen nodes inside a module test (an op test's repro is already one op: "
                          "leave --node out).")
    parse_node_range(node)   # its syntax, before anything runs
    graph = run_one(ScopeGraphTask(case, golden.invocation, scope, bool(preset.options.get("export_strict"))),
                    timeout_s=timeout_s, in_process=in_process)
    if graph.error is not None:
        raise OpdiffError(f"test '{test_id}': {graph.error}")
    start, stop = parse_node_range(node, len(graph.nodes),
                                   f"scope '{scope or '<root>'}' of test '{test_id}'")
    return write_node_repro(case, graph, start, stop, preset, out, tol, seed)


def check_rounding(case: TestCase, golden: Golden, preset: Preset, timeout_s: float, in_process: bool) -> Rounding:
    """What check judges `golden` with on `preset`: on fp16/bf16 with the elementwise
    reference and the precision control too, computed in a worker."""
    if preset.precision not in REDUCED:
        return rounding_for(golden, preset)
    flat, structure, control = run_one(ReferencesTask(case, golden.invocation, preset.precision),
                                       timeout_s=timeout_s, in_process=in_process)
    return rounding_for(golden, preset, structure, flat, control)


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
