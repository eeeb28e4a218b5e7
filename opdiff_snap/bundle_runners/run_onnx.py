"""Run a bundle's ONNX Runtime entries. Needs onnxruntime and NumPy only.

    python run_onnx.py [BUNDLE] [--repeats 5] [--warmup 1] [--only e1,e2]

Each preset's providers are the manifest's; an entry whose provider this onnxruntime lacks
fails to load, with the reason in the device record.
"""

import json
import sys

from bundle_io import arguments, artifact, run_all, versions


def main():
    import onnxruntime as ort

    args = arguments("onnx")
    with open(f"{args.bundle}/manifest.json") as f:
        providers = {name: list(p.get("options", {}).get("providers") or ["CPUExecutionProvider"])
                     for name, p in json.load(f)["presets"].items()}
    available = ort.get_available_providers()

    def load(entry):
        wanted = providers[entry["preset"]]
        missing = [p for p in wanted if p not in available]
        if missing:
            raise RuntimeError(f"this onnxruntime has no {', '.join(missing)} (it has {', '.join(available)})")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(artifact(args.bundle, entry, ".onnx"), sess_options=options, providers=wanted)
        return session, [i.name for i in session.get_inputs()]

    def call(model, arrays):
        session, names = model
        ours = {f"in{i}": a for i, a in enumerate(arrays)}
        if all(n in ours for n in names):   # the exporter may drop inputs the graph never reads
            feeds = {n: ours[n] for n in names}
        elif len(names) == len(arrays):
            feeds = dict(zip(names, arrays))
        else:
            raise RuntimeError(f"the graph takes {len(names)} inputs ({', '.join(names)}); "
                               f"the bundle has {len(arrays)}")
        return session.run(None, feeds)

    env = {"runtime": versions("onnxruntime", "onnxruntime-gpu"), "providers": list(available)}
    return run_all(args.bundle, "onnx", args, load, call, env)


if __name__ == "__main__":
    sys.exit(main())
