"""What a run or a golden ran on: library versions, the CPU and its vector extensions,
how torch was built, threads, OS. Enough to explain a numeric difference between two
machines from the history alone.

Versions come from package metadata, so nothing heavy is imported for them; the CPU
and build facts need torch, which every process of ours has loaded anyway.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import socket
import subprocess
import sys
from importlib import metadata
from typing import Any

# environment() key -> distributions to ask importlib.metadata, first found wins.
DISTRIBUTIONS = {
    "torch": ("torch",),
    "executorch": ("executorch",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-silicon"),
    "onnx": ("onnx",),
    "coremltools": ("coremltools",),
    "numpy": ("numpy",),
    "zarr": ("zarr",),
    "duckdb": ("duckdb",),
    "opdiff_snap": ("opdiff-snap",),
    # what changes results without being a runtime: ONNX export's translator, quantization,
    # the model zoo's model code
    "onnxscript": ("onnxscript",),
    "torchao": ("torchao",),
    "transformers": ("transformers",),
    "torchvision": ("torchvision",),
}
PLUGIN_GROUP = "opdiff_snap.backends"   # backends/registry.py loads plugins from it

# CPU features that change which kernels run (x86 /proc/cpuinfo flags, Arm features).
_ISA = re.compile(r"^(sse4_2|avx|avx2|fma|f16c|avx512\w*|amx\w*|asimd\w*|neon|sve\w*|i8mm|bf16|fphp|"
                  r"FEAT_\w+)$")


def package_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, str | None]:
    """Python and every library we report, None for those not installed; `plugins` names
    the distributions that provide backend plugins, with their versions."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    out.update({key: package_version(names) for key, names in DISTRIBUTIONS.items()})
    out["plugins"] = plugin_versions()
    return out


def plugin_versions() -> str | None:
    """"name version, name version" of every distribution with an entry point in the backend
    plugin group, sorted (None: none): a plugin's upgrade is an environment change like a
    runtime's. Read from package metadata; no plugin code is imported."""
    found: set[str] = set()
    try:
        points = metadata.entry_points(group=PLUGIN_GROUP)
    except Exception:   # malformed metadata somewhere on sys.path: the registry says so
        return None
    for ep in points:
        dist = ep.dist
        if dist is None or dist.name == "opdiff-snap":
            continue
        found.add(f"{dist.name} {dist.version}")
    return ", ".join(sorted(found)) or None


def _sysctl(name: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.lru_cache(maxsize=1)
def cpu() -> dict[str, Any]:
    """CPU model, the vector extensions that matter for kernels, logical cores, and the
    SIMD level torch dispatches to."""
    model, flags = platform.processor() or "", list[str]()
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                info = f.read()
        except OSError:
            info = ""
        m = re.search(r"^(model name|Model|Hardware)\s*:\s*(.+)$", info, re.M)
        model = m.group(2).strip() if m else model
        m = re.search(r"^(flags|Features)\s*:\s*(.+)$", info, re.M)
        flags = m.group(2).split() if m else []
    elif sys.platform == "darwin":
        model = _sysctl("machdep.cpu.brand_string") or model
        flags = [ln.split(":")[0].rsplit(".", 1)[-1] for ln in
                 subprocess.run(["sysctl", "hw.optional"], capture_output=True, text=True).stdout.splitlines()
                 if ln.strip().endswith(": 1")] if _sysctl("hw.optional.arm64") else []
    capability = None
    try:
        import torch
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # an older torch without the call
        pass
    return {"model": model, "isa": sorted({f for f in flags if _ISA.match(f)}),
            "cores": os.cpu_count(), "torch_capability": capability}


@functools.lru_cache(maxsize=1)
def torch_build() -> dict[str, str | None]:
    """How torch was built: BLAS, LAPACK, oneDNN, MKL and OpenMP, from torch.__config__."""
    try:
        import torch
        text = torch.__config__.show()
    except Exception:
        return {}
    settings = dict(re.findall(r"(\w+)=([^,\n]*)", text))

    def line(pattern: str) -> str | None:
        m = re.search(pattern, text)
        return m.group(0).strip() if m else None

    return {"blas": settings.get("BLAS_INFO"), "lapack": settings.get("LAPACK_INFO"),
            "onednn": line(r"MKL-DNN v[\w.]+|oneDNN v[\w.]+"), "mkl": line(r"Math Kernel Library Version [\w.\-]+"),
            "openmp": line(r"OpenMP \d+"), "cuda": settings.get("USE_CUDA")}


def os_version() -> str:
    if sys.platform == "darwin":
        return f"macOS {platform.mac_ver()[0]}"
    return f"{platform.system()} {platform.release()}"


def environment(threads: int | None = None) -> dict[str, Any]:
    """Versions, platform, CPU, torch build and (when given) the intra-op threads used."""
    env: dict[str, Any] = {
        "python": platform.python_version(), "os": platform.system(), "machine": platform.machine(),
        "host": socket.gethostname(), "os_version": os_version(), "executable": sys.executable,
    }
    env.update(versions())
    env["cpu"] = cpu()
    env["torch_build"] = torch_build()
    if threads is not None:
        env["threads"] = {"intra_op": threads, "inter_op": 1}
    return env


def differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) for every leaf that differs, in key order."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        name = f"{prefix}{key}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend(differences(va, vb, name + "."))
        elif va != vb:
            out.append((name, va, vb))
    return out
