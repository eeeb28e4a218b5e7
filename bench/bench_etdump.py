"""Can ExecuTorch's own profiler (ETDump) time each test of a batch program?

    python bench/bench_etdump.py [-n 64] [--batch 16] [--presets executorch_cpu_fp32,executorch_portable_fp32]
                                 [--warmup 1] [--repeats 5] [--threads 1] [--json FILE]

Takes n shipped tests of suites/core_aten.yaml (spread over the file, static ones only),
each made into its flat module and inputs by the package's own planning (materialize,
flat_module), and on each preset:

  alone   each test exported alone (Backend.export) and timed as a check times it today:
          its runnable (Backend.load) called warmup + repeats times on fresh inputs, the
          median wall of the timed calls (`infer_ms`). The same program is then loaded with
          ETDump on and called the same way: the median of its `Method::execute` event and
          of the sum of its top-level op and delegate events.
  batch   the same tests in batch programs of --batch (export_batch_program, the pieces a
          batch names at fault dropped and the rest compiled again), each program loaded
          with ETDump on and called warmup + repeats times on the batch's inputs. Each
          top-level event (OPERATOR_CALL, DELEGATE_CALL) is mapped to its instruction, the
          instruction to its graph nodes (the debug handle the emitter leaves on each node:
          the instruction's index) and the nodes to their pieces (family_common.pieces_of;
          for a delegate call, the nodes of its lowered module). A piece whose every event
          maps to it alone is attributed; one with an event shared with other pieces
          (a delegate blob spanning several pieces) is not.

Prints, per preset: how many pieces were attributed, how many delegate blobs span several
pieces, the median and quartiles of (piece time from ETDump) / (alone infer_ms), and of
the piece time over the alone program's own ETDump times, and ETDump's overhead on the
wall of one call (alone and batch), with the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from benchlib import ROOT, load

from opdiff_snap.backends import executorch_batch
from opdiff_snap.backends.base import Piece, PiecesFailed
from opdiff_snap.backends.executorch_lowering import PROGRAM_FILE, executorch_execute, executorch_method
from opdiff_snap.backends.family_common import pieces_of
from opdiff_snap.backends.registry import backend_for, get_preset
from opdiff_snap.execution.outputs import count_outputs
from opdiff_snap.execution.prepare import flat_module
from opdiff_snap.suite import load_suites
from opdiff_snap.suite.materialize import materialize

TOP = ("OPERATOR_CALL", "DELEGATE_CALL")


def plan(n: int) -> list[tuple[str, object]]:
    """n static tests of core_aten spread over the file: (id, Prepared)."""
    cases = [c for c in load_suites([ROOT / "suites" / "core_aten.yaml"]) if c.dynamic is None and not c.grad]
    step = max(1, len(cases) // n)
    out = []
    for case in cases[::step]:
        if len(out) == n:
            break
        try:
            prepared = flat_module(case, materialize(case, case.seeds[0]))
        except Exception:
            continue
        if count_outputs(prepared.out_structure):
            out.append((case.id, prepared))
    return out


def wall_ms(call, warmup: int, repeats: int) -> float:
    """The median wall of `repeats` calls after `warmup` ones, as runner._infer times a job."""
    times = []
    with torch.no_grad():
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            call()
            dt = (time.perf_counter() - t0) * 1e3
            if i >= warmup:
                times.append(dt)
    return statistics.median(times)


def etdump_runs(path: Path, feed: list[torch.Tensor], warmup: int, repeats: int, tmp: Path
                ) -> tuple[list[list], float]:
    """The program at `path` loaded with ETDump on and called warmup + repeats times: the
    profile events of each timed call, and the median wall of those calls (ms)."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc
    from executorch.runtime import Runtime, Verification

    program = Runtime.get().load_program(path, verification=Verification.Minimal, enable_etdump=True)
    method = program.load_method("forward")
    wall = wall_ms(lambda: executorch_execute(method, [t.clone() for t in feed]), warmup, repeats)
    dump = tmp / "run.etdp"
    program.write_etdump_result_to_file(str(dump), str(tmp / "run.bin"))
    data = deserialize_from_etdump_flatcc(dump.read_bytes())
    runs = [[e.profile_event for e in (r.events or []) if e.profile_event is not None]
            for r in data.run_data if any(e.profile_event and e.profile_event.name == "Method::execute"
                                          for e in (r.events or []))]
    return runs[warmup:], wall


def plain_ms(path: Path, feed: list[torch.Tensor], warmup: int, repeats: int, options) -> float:
    """The median wall of the same calls as etdump_runs, the program loaded without ETDump."""
    method = executorch_method(path, options)
    return wall_ms(lambda: executorch_execute(method, [t.clone() for t in feed]), warmup, repeats)


def execute_ms(run: list) -> float:
    return sum(e.end_time - e.start_time for e in run if e.name == "Method::execute") / 1e6


def top_ms(run: list) -> float:
    return sum(e.end_time - e.start_time for e in run if e.name in TOP) / 1e6


def instruction_pieces(graph_module) -> tuple[dict[int, set[int]], int, int]:
    """Instruction index -> the pieces its nodes belong to, read from the program after
    to_executorch (the emitter replaces each node's debug handle by its instruction's
    index); and how many delegate calls there are, and how many span several pieces."""
    found: dict[int, set[int]] = {}
    blobs = spanning = 0
    for node in graph_module.graph.nodes:
        handle = node.meta.get("debug_handle")
        if node.op != "call_function" or not isinstance(handle, int) or node.target is operator.getitem \
                or getattr(node.target, "__name__", "") == "alloc":
            continue   # no instruction of their own (a getitem keeps its producer's handle)
        if "executorch_call_delegate" in str(node.target):
            lowered = getattr(graph_module, str(node.args[0].target))
            owners: set[int] = set()
            for inner in lowered.original_module.graph.nodes:
                if inner.op == "call_function":
                    owners |= pieces_of(inner)
            blobs += 1
            spanning += len(owners) > 1
        else:
            owners = pieces_of(node)
        found.setdefault(handle, set()).update(owners)
    return found, blobs, spanning


def quartiles(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    q = statistics.quantiles(values, n=4)
    return f"{q[1]:.3f} [{q[0]:.3f}, {q[2]:.3f}]"


def measure(preset_name: str, tests: list, batch: int, warmup: int, repeats: int, threads: int, tmp: Path) -> dict:
    preset = get_preset(preset_name)
    backend = backend_for(preset)
    alone: dict[int, dict] = {}
    for i, (_, prepared) in enumerate(tests):
        work = tmp / preset_name / f"alone{i}"
        try:
            with torch.no_grad():
                artifact = backend.export(prepared.module, tuple(prepared.fresh_inputs()), preset, work)
            runnable = backend.load(artifact, preset, threads=threads)
            infer = wall_ms(lambda r=runnable, p=prepared: r(p.fresh_inputs()), warmup, repeats)
            feed = backend.device_feed(preset, prepared.inputs)
            runs, et_wall = etdump_runs(work / PROGRAM_FILE, feed, warmup, repeats, work)
            plain = plain_ms(work / PROGRAM_FILE, feed, warmup, repeats, preset.options)
        except Exception as exc:
            alone[i] = {"error": f"{type(exc).__name__}: {str(exc)[:80]}"}
            continue
        alone[i] = {"infer_ms": infer, "plain_ms": plain, "etdump_wall_ms": et_wall,
                    "execute_ms": statistics.median(execute_ms(r) for r in runs),
                    "top_ms": statistics.median(top_ms(r) for r in runs)}
    ok = [i for i in range(len(tests)) if "infer_ms" in alone[i]]

    # batch programs: capture the lowered program export_batch_program makes (its debug handles)
    lowered_seen: list = []
    original = executorch_batch.executorch_program

    def spy(edge, opts):
        lowered_seen.append(original(edge, opts))
        return lowered_seen[-1]

    executorch_batch.executorch_program = spy
    pieces_ms: dict[int, float] = {}
    share_ms: dict[int, float] = {}     # plus an even share of the batch call's time outside its events
    delegated: set[int] = set()
    inner: list[tuple[int, bool]] = []  # the events a delegate logs inside its calls
    unattributed: dict[int, str] = {}
    batch_rows = []
    blobs = spanning = 0
    try:
        groups = [ok[k:k + batch] for k in range(0, len(ok), batch)]
        while groups:
            group = groups.pop(0)
            if len(group) < 2:
                unattributed.update({i: "alone in its batch" for i in group})
                continue
            work = tmp / preset_name / f"batch{group[0]}_{len(group)}"
            pieces = [Piece(tests[i][1].module, tuple(tests[i][1].fresh_inputs()),
                            count_outputs(tests[i][1].out_structure)) for i in group]
            lowered_seen.clear()
            try:
                with torch.no_grad():
                    artifacts = executorch_batch.export_batch_program(pieces, preset, work, True)
            except PiecesFailed as exc:
                bad = {group[p] for p in exc.pieces if 0 <= p < len(group)}
                unattributed.update({i: "at fault in its batch" for i in bad})
                if bad:
                    groups.insert(0, [i for i in group if i not in bad])
                else:
                    unattributed.update({i: "batch failed, no piece named" for i in group})
                continue
            except Exception as exc:
                unattributed.update({i: f"batch failed: {type(exc).__name__}" for i in group})
                continue
            owners, b, s = instruction_pieces(lowered_seen[-1].exported_program().graph_module)
            blobs, spanning = blobs + b, spanning + s
            folder = Path(artifacts[0].path)
            examples = torch.load(folder / executorch_batch.BATCH_INPUTS_FILE, weights_only=True)
            feed = backend.device_feed(preset, examples)
            runs, et_wall = etdump_runs(folder / PROGRAM_FILE, feed, warmup, repeats, folder)
            runnable = backend.load(artifacts[0], preset, threads=threads)
            first = tests[group[0]][1]
            call = wall_ms(lambda r=runnable, p=first: r(p.fresh_inputs()), warmup, repeats)
            plain = plain_ms(folder / PROGRAM_FILE, feed, warmup, repeats, preset.options)
            per_piece: dict[int, list[float]] = {p: [] for p in range(len(group))}
            shared: set[int] = set()
            orphan = []
            for run in runs:
                sums = dict.fromkeys(range(len(group)), 0.0)
                lost = 0.0
                for e in run:
                    if e.delegate_debug_id_str is not None or (e.delegate_debug_id_int or -1) >= 0:
                        # an op inside a delegate call: its time, and whether it names a debug handle
                        inner.append((e.end_time - e.start_time, (e.delegate_debug_id_int or -1) >= 0))
                    if e.name not in TOP or e.chain_index != 0:
                        continue
                    who = owners.get(e.instruction_id, set())
                    if len(who) == 1:
                        sums[next(iter(who))] += (e.end_time - e.start_time) / 1e6
                        if e.name == "DELEGATE_CALL":
                            delegated.add(group[next(iter(who))])
                    elif who:
                        shared |= who
                    else:
                        lost += (e.end_time - e.start_time) / 1e6
                for p, v in sums.items():
                    per_piece[p].append(v)
                orphan.append(lost)
            for p, i in enumerate(group):
                if p in shared:
                    unattributed[i] = "an event shared with other pieces"
                else:
                    pieces_ms[i] = statistics.median(per_piece[p])
                    share_ms[i] = pieces_ms[i] + (call - statistics.median(top_ms(r) for r in runs)) / len(group)
            batch_rows.append({"size": len(group), "call_ms": call, "plain_ms": plain, "etdump_wall_ms": et_wall,
                               "execute_ms": statistics.median(execute_ms(r) for r in runs),
                               "top_ms": statistics.median(top_ms(r) for r in runs), "blobs": b, "spanning": s,
                               "orphan_ms": statistics.median(orphan),
                               "events": statistics.median(len(r) for r in runs)})
    finally:
        executorch_batch.executorch_program = original

    ratio = [pieces_ms[i] / alone[i]["infer_ms"] for i in pieces_ms]
    us = 1e3
    ratio_exec = [pieces_ms[i] / alone[i]["execute_ms"] for i in pieces_ms]
    ratio_top = [pieces_ms[i] / alone[i]["top_ms"] for i in pieces_ms if alone[i]["top_ms"] > 0]
    return {
        "preset": preset_name, "tests": len(tests), "alone_ok": len(ok),
        "alone_errors": sorted({a["error"] for a in alone.values() if "error" in a})[:5],
        "attributed": len(pieces_ms), "unattributed": dict(sorted(_count(unattributed.values()).items())),
        "batches": len(batch_rows), "delegate_blobs": blobs, "blobs_spanning_pieces": spanning,
        "delegated_pieces": len(delegated & set(pieces_ms)),
        "ratio_vs_infer_ms": quartiles(ratio),
        "ratio_vs_infer_ms_delegated": quartiles([pieces_ms[i] / alone[i]["infer_ms"] for i in pieces_ms
                                                  if i in delegated]),
        "ratio_vs_infer_ms_portable_ops": quartiles([pieces_ms[i] / alone[i]["infer_ms"] for i in pieces_ms
                                                     if i not in delegated]),
        "ratio_with_call_share_vs_infer_ms": quartiles([share_ms[i] / alone[i]["infer_ms"] for i in share_ms]),
        "ratio_vs_alone_execute": quartiles(ratio_exec),
        "ratio_vs_alone_top_events": quartiles(ratio_top),
        "piece_us": quartiles([v * us for v in pieces_ms.values()]),
        "alone_infer_us": quartiles([alone[i]["infer_ms"] * us for i in ok]),
        "alone_python_execute_us": quartiles([alone[i]["plain_ms"] * us for i in ok]),
        "alone_execute_us": quartiles([alone[i]["execute_ms"] * us for i in ok]),
        "alone_top_us": quartiles([alone[i]["top_ms"] * us for i in ok]),
        "alone_etdump_overhead": quartiles([alone[i]["etdump_wall_ms"] / alone[i]["plain_ms"] for i in ok]),
        "batch_call_us": quartiles([r["call_ms"] * us for r in batch_rows]),
        "batch_execute_us": quartiles([r["execute_ms"] * us for r in batch_rows]),
        "batch_top_us": quartiles([r["top_ms"] * us for r in batch_rows]),
        "batch_unowned_event_us": quartiles([r["orphan_ms"] * us for r in batch_rows]),
        "batch_events_per_call": quartiles([r["events"] for r in batch_rows]),
        "batch_etdump_overhead": quartiles([r["etdump_wall_ms"] / r["plain_ms"] for r in batch_rows]),
        "delegate_inner_events": len(inner),
        "inner_events_zero_ns": sum(d == 0 for d, _ in inner),
        "inner_events_whole_us": sum(d % 1000 == 0 for d, _ in inner),
        "inner_events_naming_a_handle": sum(h for _, h in inner),
    }


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=64, help="tests of core_aten (default 64)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--presets", default="executorch_cpu_fp32,executorch_portable_fp32")
    ap.add_argument("--warmup", type=int, default=1, help="untimed calls (a check's default: 1)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls (a check's default: 5)")
    ap.add_argument("--threads", type=int, default=1, help="the runtime's thread budget (load's `threads`)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    tests = plan(args.n)
    results = []
    with tempfile.TemporaryDirectory(prefix="opdiff-bench-etdump-") as tmp:
        for name in args.presets.split(","):
            before = load()
            row = measure(name, tests, args.batch, args.warmup, args.repeats, args.threads, Path(tmp))
            row["load_1min"] = round(before, 2)
            results.append(row)
            print(json.dumps(row), flush=True)
    keys = [k for k in results[0] if k != "preset"]
    print()
    print("| measure | " + " | ".join(r["preset"] for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for k in keys:
        print(f"| {k} | " + " | ".join(str(r[k]) for r in results) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
