"""The field tables of the suite format: the keys each part of a suite may hold, the node
types and their fields, and the dtypes, kinds and initialisations a value may name."""

from __future__ import annotations

TOP_KEYS = ("include", "dims", "presets", "tests", "defaults")
EXTENSION_KEYS = ("tolerance", "seeds", "tags", "skip", "grad", "profiles")
TOLERANCE_KEYS = ("atol", "rtol", "baseline_factor", "precision_factor", "steps", "min_sqnr")
TEST_KEYS = ("id", "op", "in", "kwargs", "out", "impl", "device", "cast_input0_to_complex", "dynamic") + EXTENSION_KEYS
DEVICES = ("cpu", "gpu", "cuda", "mps")
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "int8pt", "int8dyn")

KINDS = {"float": "float32", "int": "int64", "bool": "bool"}
DTYPES = ("float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64",
          "uint8", "bool", "complex64", "complex128")
INITS = ("normal", "uniform", "randint", "zeros", "ones", "bernoulli")
# the integers each integer dtype holds; a Python int given to torch becomes an int64
INT_RANGES = {"int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1), "int32": (-2**31, 2**31 - 1),
              "int64": (-2**63, 2**63 - 1), "uint8": (0, 2**8 - 1)}
RANDINT_HIGH = 2**63 - 2   # randint draws int64 values below high + 1, which must be an int64 too
SAMPLING_FIELDS = ("init", "low", "high", "mean", "std", "p")

NODE_FIELDS: dict[str, tuple[str, ...]] = {
    "tensor": ("shape", "kind", "dtype", "init", "low", "high", "mean", "std", "p", "requires_grad"),
    "scalar": ("kind", "dtype", "value", "low", "high", "p"),
    "scalar_tensor": ("kind", "dtype", "value", "init", "low", "high", "mean", "std", "p", "requires_grad"),
    "const": ("value",),
    "const_tensor": ("shape", "kind", "dtype", "value", "init", "low", "high", "mean", "std", "p"),
    "int_list": ("elems",),
    "list": ("len", "elem"),
    "tuple": ("elems",),
    "optional": ("elem", "p_none"),
    "ref": ("ref",),
    "var": ("name",),
    "module": ("path", "args", "kwargs", "config"),
    "construct": ("path", "args", "kwargs", "config"),
    "template_module": ("path", "vars", "cases", "args", "kwargs", "config"),
    "template_compare_pair": ("vars", "cases", "common", "a", "b"),
}
REQUIRED: dict[str, tuple[str, ...]] = {
    "tensor": ("shape",), "const": ("value",), "const_tensor": ("shape",), "int_list": ("elems",),
    "list": ("len", "elem"), "tuple": ("elems",), "optional": ("elem",), "ref": ("ref",),
    "var": ("name",), "module": ("path",), "construct": ("path",), "template_module": ("path",),
    "template_compare_pair": ("a", "b"),
}
SIDE_FIELDS = ("impl", "type", "path", "args", "kwargs", "config")
OP_NODE_TYPES = ("module", "template_module", "template_compare_pair")


def dtype_family(dtype: str) -> str:
    if dtype == "bool":
        return "bool"
    if dtype.startswith(("int", "uint")):
        return "int"
    if dtype.startswith("complex"):
        return "complex"
    return "float"

