"""ExecuTorch batch programs: several tests compiled into one program (one exporter call),
each test given a folder of its own that says where it sits among the program's inputs
and outputs, and the batch's example inputs that fill the other tests' places.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import torch

from .base import Artifact, Piece, PiecesFailed, Preset
from .executorch_lowering import (
    DELEGATION_FILE,
    PROGRAM_FILE,
    delegation_of,
    executorch_edge,
    executorch_execute,
    executorch_method,
    executorch_program,
)
from .family_common import Pieces, cast_inputs, contiguous_cpu, export_program, pieces_at_fault, pieces_of

# a test compiled in a batch program: where it sits among the program's inputs and outputs,
# and the batch's example inputs, which fill the other tests' places when it runs
PIECE_FILE = "piece.json"
BATCH_INPUTS_FILE = "batch_inputs.pt"
BATCH_DEVICES = ("cpu", "portable")   # the devices whose batch programs run here to be proven


def export_batch_program(pieces: Sequence[Piece], preset: Preset, workdir: Path, can_run: bool
                         ) -> list[Artifact | None]:
    """ExecuTorchBackend.export_batch: one program whose single forward runs every piece on
    its own inputs. Each piece gets a folder holding the program (a hard link where the
    disk allows), where it sits in the program's inputs and outputs (piece.json), the
    batch's example inputs, and the delegation of its own nodes. `can_run`: this machine
    runs the preset, so the program is loaded and called once here to prove it."""
    opts = preset.options
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    arity = [len(p.inputs) for p in pieces]
    inputs = [t for p in pieces for t in p.inputs]
    try:
        program = export_program(Pieces([p.module for p in pieces], arity), inputs, opts, always_decompose=False)
        edge = executorch_edge(program, preset.device, preset.precision, opts)
        returned = len(edge.exported_program().graph_signature.user_outputs)
        # of the edge program as lowered: to_executorch rewrites its graph in place
        delegations = [delegation_of(edge.exported_program().graph_module, piece=i).to_json()
                       if preset.device != "portable" else None for i in range(len(pieces))]
        lowered = executorch_program(edge, opts)
    except Exception as exc:
        at_fault = pieces_at_fault(exc)
        if at_fault:
            raise PiecesFailed(at_fault) from exc
        raise
    if returned != sum(p.outputs for p in pieces):
        raise RuntimeError(f"the batch program returns {returned} outputs; its pieces return "
                           f"{sum(p.outputs for p in pieces)}")
    missing = _without_kernels(lowered.exported_program().graph_module) if can_run else []
    if missing:
        raise PiecesFailed(missing, "the runtime has no kernel for an op of these pieces")
    shared = workdir / PROGRAM_FILE
    with open(shared, "wb") as f:
        lowered.write_to_file(f)
    examples = workdir / BATCH_INPUTS_FILE
    torch.save([t.detach().contiguous().cpu() for t in inputs], examples)
    if can_run:
        # one piece whose kernel rejects its arguments would fail the whole program for
        # every test in it: found here, the batch is split instead
        dtype = torch.float16 if opts.get("export_fp16") else None
        executorch_execute(executorch_method(shared, opts), contiguous_cpu(cast_inputs(inputs, dtype)))
    artifacts: list[Artifact | None] = []
    first_in = first_out = 0
    for i, piece in enumerate(pieces):
        folder = workdir / f"piece{i}"
        folder.mkdir()
        _link(shared, folder / PROGRAM_FILE)
        _link(examples, folder / BATCH_INPUTS_FILE)
        (folder / PIECE_FILE).write_text(json.dumps(
            {"inputs": [first_in, arity[i]], "outputs": [first_out, piece.outputs], "batch": len(pieces)}))
        if delegations[i] is not None:
            (folder / DELEGATION_FILE).write_text(json.dumps(delegations[i]))
        artifacts.append(Artifact(path=folder))
        first_in += arity[i]
        first_out += piece.outputs
    shared.unlink()
    examples.unlink()
    return artifacts


def _without_kernels(graph_module: Any) -> list[int]:
    """The pieces of a batch program (after to_executorch) calling an op the runtime here
    has no kernel for: loading the program would fail for every test in it."""
    try:
        from executorch.extension.pybindings import portable_lib
        registered = set(portable_lib._get_operator_names())
    except (ImportError, AttributeError):
        return []
    found: set[int] = set()
    for node in graph_module.graph.nodes:
        schema = getattr(node.target, "_schema", None) or getattr(getattr(node.target, "_op", None), "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        if name not in registered and schema.name not in registered:
            found |= pieces_of(node)
    return sorted(found)


def _link(source: Path, target: Path) -> None:
    """`target` as a hard link to `source` (one copy of a batch's program on disk), or a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def batch_place(folder: Path) -> tuple[tuple[int, int], tuple[int, int], list[torch.Tensor]] | None:
    """Where a batch-compiled test sits in its program ((first input, count), (first output,
    count)) and the batch's example inputs; None for a program of its own. Raises
    ValueError when the folder's account of it is not what export_batch wrote."""
    path = folder / PIECE_FILE
    if not path.exists():
        return None
    try:
        place = json.loads(path.read_text())
        spans = [place["inputs"], place["outputs"]]
        if not all(isinstance(s, list) and len(s) == 2 and all(isinstance(v, int) and v >= 0 for v in s)
                   for s in spans):
            raise ValueError(f"{PIECE_FILE} does not say where the test sits in its batch")
        examples = torch.load(folder / BATCH_INPUTS_FILE, weights_only=True)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ValueError(f"the batch program's account of this test cannot be read ({exc})") from None
    if not isinstance(examples, list) or spans[0][0] + spans[0][1] > len(examples):
        raise ValueError(f"{BATCH_INPUTS_FILE} does not hold the batch's inputs")
    return (spans[0][0], spans[0][1]), (spans[1][0], spans[1][1]), examples
