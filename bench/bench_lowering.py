"""What finding every op a backend cannot lower costs, on tiny real architectures.

    python bench/bench_lowering.py                       # GPT-2, Llama, T5 on three presets, -j 2
    python bench/bench_lowering.py --models gpt2 --presets coreml_any_fp16 -j 2

Needs `transformers` (not in the lock: `pip install transformers`); the models are built
from configs with random weights, nothing is downloaded. Each model is exported to ATen
once (execution.op_survey.module_graph), then every distinct (op, input signature) is lowered
alone on each preset in a pool of isolated workers, first with an empty op-support cache,
then again from the cache. Prints one markdown row per (model, preset).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile

import torch
from benchlib import timed

from opdiff_snap.backends.registry import get_preset
from opdiff_snap.execution.op_support import OpSupportCache
from opdiff_snap.execution.op_survey import module_graph, survey_graph
from opdiff_snap.execution.pool import WorkerPool
from opdiff_snap.execution.prepare import prepare_call


class LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, encoder_decoder: bool = False):
        super().__init__()
        self.model, self.encoder_decoder = model, encoder_decoder

    def forward(self, ids):
        if self.encoder_decoder:
            return self.model(input_ids=ids, decoder_input_ids=ids, use_cache=False).last_hidden_state
        return self.model(input_ids=ids, use_cache=False).last_hidden_state


def build(name: str) -> torch.nn.Module:
    import transformers as t

    if name == "gpt2":
        return LastHidden(t.GPT2Model(t.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)))
    if name == "llama":
        return LastHidden(t.LlamaModel(t.LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                                     hidden_size=32, intermediate_size=64, vocab_size=100)))
    if name == "t5":
        return LastHidden(t.T5Model(t.T5Config(num_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64,
                                               vocab_size=100)), encoder_decoder=True)
    raise SystemExit(f"unknown model {name!r}: gpt2, llama or t5")


def aten_graph(module: torch.nn.Module, ids: torch.Tensor, name: str):
    prepared = prepare_call({"a": module}, [ids], {}, name)
    return module_graph(prepared.module, prepared.fresh_inputs(), name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama", "t5"])
    ap.add_argument("--presets", nargs="+", default=["coreml_any_fp16", "onnx_cpu_fp32", "executorch_cpu_fp32"])
    ap.add_argument("-j", "--jobs", type=int, default=2)
    args = ap.parse_args()
    try:
        import transformers  # noqa: F401
    except ImportError:
        sys.exit("bench_lowering needs transformers: pip install transformers")
    torch.manual_seed(0)
    print("| model | preset | ATen nodes | distinct op calls | graph s | cold: lowered alone, s "
          "| cached: s | cannot lower (nodes) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp, WorkerPool(jobs=args.jobs, timeout_s=600) as pool:
        cache = OpSupportCache(tmp)
        for name in args.models:
            module = build(name).eval()
            ids = torch.randint(0, 100, (1, 8))
            graph, graph_s = timed(functools.partial(aten_graph, module, ids, name))
            for preset_name in args.presets:
                preset = get_preset(preset_name)
                cold = survey_graph(graph, preset, pool.run, cache)
                warm = survey_graph(graph, preset, pool.run, cache)
                ops = ", ".join(f"`{u.op.removeprefix('aten::')}` ({u.count})" for u in cold.ops) or "none"
                print(f"| {name} | {preset_name} | {len(graph.nodes)} | {cold.calls} | {graph_s:.1f} "
                      f"| {cold.asked} in {cold.seconds:.1f} | {warm.seconds:.2f} | {ops} |", flush=True)


if __name__ == "__main__":
    main()
