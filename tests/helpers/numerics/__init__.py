"""Backends that are wrong on purpose, or right in another summation order, and the
suites they are checked on (tests/test_check_numerics.py)."""

ENTRY_POINTS = ("[opdiff_snap.backends]\n"
                "wrongkernel = helpers.numerics.backends:WrongKernelBackend\n"
                "splitsum = helpers.numerics.backends:SplitSumBackend\n")


def x86_int8_saturates() -> bool:
    """Whether the x86 int8 kernels of ONNX Runtime (MLAS) and of inductor (oneDNN) may
    saturate on this CPU: without VNNI (AVX2 only) they sum pairs of u8*s8 products in int16.
    Measured on an AMD EPYC with AVX2 only: a 64x64 QDQ MatMul with weights in [-1, 1] and
    inputs in [0, 1] runs 0.98 from its QDQ reference on ONNX Runtime with reduce_range off, 0
    with it on; the int8 test MLP is 7 steps from its reference on onnx_cpu_int8 and 10.4 on
    inductor_cpu_int8 (at most 2 on a CPU with VNNI)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return False
    return not {"avx512_vnni", "avx_vnni", "avx512vnni"} & set(flags)
