"""ExecuTorch's own device format for a bundle entry: a BundledProgram (the .pte, the inputs
it is fed, the golden's outputs as what it must give), which ExecuTorch's C++ runners
verify on a device without Python (docs/bundles.md), and ExecuTorch's Python verification
of one, with its own elementwise tolerance (not opdiff's judge)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch


def write_bundled_program(pte: Path, inputs: Sequence[torch.Tensor], expected: Sequence[torch.Tensor],
                          target: Path) -> None:
    """`target`: the program at `pte` with one test case (these inputs, these outputs)."""
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    case = MethodTestCase(inputs=list(inputs), expected_outputs=list(expected))
    program = BundledProgram(None, [MethodTestSuite(method_name="forward", test_cases=[case])],
                             pte_file_path=str(pte))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(serialize_from_bundled_program_to_flatbuffer(program))


def verify_bundled_program(path: Path, rtol: float = 1e-5, atol: float = 1e-8) -> str:
    """"" when ExecuTorch's runtime gives the bundled outputs within its tolerance, else why not."""
    from executorch.extension.pybindings.portable_lib import _load_bundled_program_from_buffer

    module = _load_bundled_program_from_buffer(path.read_bytes())
    try:
        module.verify_result_with_bundled_expected_output("forward", 0, rtol=rtol, atol=atol)
    except RuntimeError as exc:
        return str(exc)
    return ""


def expected_as_fed(expected: Sequence[torch.Tensor], half: bool) -> list[torch.Tensor]:
    """The golden's outputs in the dtypes the program returns: float16 where it runs in it."""
    return [t.half() if half and t.is_floating_point() else t.contiguous() for t in expected]
