"""Modules that misbehave on purpose, for the execution tests (loaded as file: paths)."""

import ctypes
import subprocess
import sys
import time

import torch


class Segfault(torch.nn.Module):
    """Reads address 0: the process dies from SIGSEGV."""

    def forward(self, x):
        print("segfault: about to read address 0", file=sys.stderr, flush=True)
        ctypes.string_at(0)
        return x


class Hang(torch.nn.Module):
    """Never returns."""

    def forward(self, x):
        while True:
            time.sleep(1)


class SpawnAndHang(torch.nn.Module):
    """Starts `sleep ARG` (a process to look for afterwards), then never returns."""

    def __init__(self, arg):
        super().__init__()
        self.arg = str(arg)

    def forward(self, x):
        subprocess.Popen(["sleep", self.arg])
        while True:
            time.sleep(1)


class Scaled(torch.nn.Module):
    """A well-behaved module with a parameter and a buffer."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n))
        self.register_buffer("offset", torch.randn(n))

    def forward(self, x):
        return x * self.weight + self.offset



class DataDependent(torch.nn.Module):
    """Fine in eager mode; torch.export rejects Python control flow on tensor values."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


class LoudFailure(torch.nn.Module):
    """Says why on stderr, then raises a terse error (as native runtimes do)."""

    def forward(self, x):
        print("[runtime.cpp:42] Missing operator: aten::made_up.out", file=sys.stderr, flush=True)
        raise RuntimeError("Failed to run method forward, error: 0x14")


class CachesOnFirstCall(torch.nn.Module):
    """Keeps a tensor it builds in its weight's dtype on its first call, as some models keep
    attention biases in eval mode: cast after that call, its cache keeps the old dtype."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n))
        self.cache = {}

    def forward(self, x):
        if "w2" not in self.cache:
            self.cache["w2"] = self.weight * 2
        return x @ self.cache["w2"]


class AtExit(torch.nn.Module):
    """Registers an exit handler that writes `path` when the worker process exits (as a
    library's clean-up does: tqdm's releases a named semaphore)."""

    def __init__(self, path):
        super().__init__()
        self.path = str(path)

    def forward(self, x):
        import atexit
        from pathlib import Path

        atexit.register(Path(self.path).write_text, "ran")
        return x
