"""`qbias_cpu_int8`: ExecuTorch's int8 preset with a planted change, chosen by its option
`plant`:

- "bias" (the default), a lowering bug: what is lowered (after the quantized reference
  is computed) has its first quantized `aten.linear` get one quantization step of its output (the
  scale of the quantize that follows it) added to its bias, and the program is lowered
  from that: a backend whose one kernel comes out one step up on every result. Tests
  without a linear layer are not reached.
- "coarse_weights", a quantizer change: weights quantized to 4 bits ([-8, 7]) instead of
  8, under the same preset name, as a new quantizer release might; lowering untouched.
- "none": ExecuTorch's int8 preset as it is.
"""

from __future__ import annotations

import torch

from opdiff_snap.backends.executorch import ExecuTorchBackend
from opdiff_snap.backends.int8_quantizers import pt2e_quantize, xnnpack_quantizer

PLANTS = ("bias", "coarse_weights", "none")

ENTRY_POINTS = "[opdiff_snap.backends]\nqbias = helpers.numerics.planted_int8:QBiasBackend\n"
PRESET = "qbias_cpu_int8"


def _plant_step(graph_module: torch.fx.GraphModule) -> bool:
    """Add one output step to the bias of the first linear whose output is quantized (the
    scale of that quantize), so its every result comes out one step up while the graph, and
    what the delegate takes of it, stay as they were. False when there is none."""
    for node in graph_module.graph.nodes:
        if node.target is not torch.ops.aten.linear.default or len(node.args) < 3:
            continue
        quantize = next((u for u in node.users if "quantize_per_tensor" in str(u.target)), None)
        bias = node.args[2]
        if quantize is None or getattr(bias, "op", None) != "get_attr":
            continue
        with torch.no_grad():
            graph_module.get_parameter(str(bias.target)).add_(float(quantize.args[1]))
        return True
    return False


def _coarse_quantizer():
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    config = get_symmetric_quantization_config(is_per_channel=True, weight_qmin=-8, weight_qmax=7)
    return XNNPACKQuantizer().set_global(config)


class QBiasBackend(ExecuTorchBackend):
    family = "qbias"
    devices = ("cpu",)
    precisions = ("int8",)
    default_options = {**ExecuTorchBackend.default_options, "plant": "bias"}

    def quantize(self, module, inputs, calibration, preset):
        plant = preset.options["plant"]
        if plant not in PLANTS:
            raise ValueError(f"plant must be one of {PLANTS}")
        scheme = preset.scheme
        quantizer = (_coarse_quantizer() if plant == "coarse_weights"
                     else xnnpack_quantizer(scheme.per_channel, scheme.dynamic))
        return pt2e_quantize(module, inputs, calibration, quantizer, preset.options)

    def lower_quantized(self, module, inputs, preset, workdir):
        if preset.options["plant"] == "bias":
            _plant_step(module)
        return self.export(module, inputs, preset, workdir)
