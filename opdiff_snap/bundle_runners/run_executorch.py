"""Run a bundle's ExecuTorch entries through ExecuTorch's Python runtime (executorch.runtime,
which takes and returns torch tensors, so it pulls torch in; NumPy for the files).

    python run_executorch.py [BUNDLE] [--repeats 5] [--warmup 1] [--only e1,e2]

Where there is no Python, each entry's bundled/<id>.bpte is an ExecuTorch BundledProgram
for ExecuTorch's own C++ runners (docs/bundles.md).
"""

import sys

from bundle_io import arguments, artifact, run_all, versions


def main():
    import torch
    from executorch.runtime import Runtime

    args = arguments("executorch")
    runtime = Runtime.get()

    def load(entry):
        return runtime.load_program(artifact(args.bundle, entry, ".pte")).load_method("forward")

    def call(method, arrays):
        outputs = method.execute([torch.from_numpy(a.copy()) for a in arrays])
        # outputs may live in the method's planned memory: copied before the next call
        return [o.detach().clone().numpy() if isinstance(o, torch.Tensor) else o for o in outputs]

    env = {"runtime": versions("executorch", "torch")}
    return run_all(args.bundle, "executorch", args, load, call, env)


if __name__ == "__main__":
    sys.exit(main())
