"""Run a bundle's CoreML entries on macOS with coremltools and NumPy, each on the compute
unit of its preset (cpu: CPU_ONLY, gpu: CPU_AND_GPU, ane: CPU_AND_NE, any: ALL).

    python run_coreml.py [BUNDLE] [--repeats 5] [--warmup 1] [--only e1,e2]
"""

import sys

from bundle_io import arguments, artifact, run_all, versions


def main():
    args = arguments("coreml")
    if sys.platform != "darwin":
        sys.exit("run_coreml.py: CoreML predicts only on macOS; run this bundle's CoreML entries on a Mac "
                 "(python3 -m pip install coremltools numpy; python3 run_coreml.py), then bring the folder back "
                 "for `opdiff check --outputs-from`. Nothing was run.")
    import coremltools as ct

    def load(entry):
        units = getattr(ct.ComputeUnit, entry["compute_units"] or "ALL")
        model = ct.models.MLModel(artifact(args.bundle, entry, ".mlpackage"), compute_units=units)
        spec = model.get_spec()
        kinds = ct.proto.FeatureTypes_pb2.ArrayFeatureType
        dtypes = {kinds.FLOAT32: "float32", kinds.FLOAT16: "float16", kinds.INT32: "int32", kinds.DOUBLE: "float64"}
        ins = [(i.name, dtypes.get(i.type.multiArrayType.dataType, "float32")) for i in spec.description.input]
        return model, ins, [o.name for o in spec.description.output]

    def call(model, arrays):
        mlmodel, ins, outs = model
        if len(arrays) != len(ins):
            raise RuntimeError(f"the model takes {len(ins)} inputs; the bundle has {len(arrays)}")
        result = mlmodel.predict({name: a.astype(dtype) for (name, dtype), a in zip(ins, arrays)})
        return [result[name] for name in outs]

    env = {"runtime": versions("coremltools")}
    return run_all(args.bundle, "coreml", args, load, call, env)


if __name__ == "__main__":
    sys.exit(main())
