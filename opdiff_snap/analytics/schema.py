"""One line of meaning per column of the `runs` and `results` views and the `verdicts` table
(`opdiff query --schema`)."""

from ..core.verdicts import KINDS, PASSING, PRECEDENCE

_LIB = "version of {} in the run's environment (NULL if not installed)"

MEANINGS: dict[str, dict[str, str]] = {
    "runs": {
        "run_id": "run id, <UTC timestamp>-<6 hex> (opdiff's own files: the file name)",
        "command": "record or check (NULL for files written by opdiff)",
        "started": "when the run started (UTC)",
        "finished": "when it wrote its end line (UTC); NULL if interrupted",
        "complete": "true when the run wrote its end line; false: interrupted, resumable",
        "wall_s": "run wall time in seconds, from the end line",
        "host": "machine host name", "os": "operating system", "machine": "CPU architecture",
        **{k: _LIB.format(k) for k in ("python", "torch", "executorch", "onnxruntime", "onnx",
                                       "coremltools", "numpy", "opdiff_snap", "onnxscript", "torchao",
                                       "transformers", "torchvision")},
        "plugins": "distributions providing backend plugins, with versions ('name 1.1, other 2.0'); NULL: none",
        "os_version": "OS name and version (macOS version on a Mac)",
        "cpu_model": "CPU model", "cpu_isa": "vector extensions of the CPU (avx2, avx512*, amx*, neon, ...)",
        "cpu_capability": "SIMD level torch dispatches to (torch.backends.cpu.get_cpu_capability())",
        "threads": "intra-op threads each worker ran with",
        "blas": "BLAS torch was built with", "onednn": "oneDNN version torch was built with",
        "executable": "the Python interpreter the workers ran under (check --python, upgrade)",
        "suites": "suite files the run read",
        "presets": "presets the run exercised",
        "baseline_preset": "the preset the goldens were recorded with",
        "file": "the JSONL file holding the run",
        "run_group": "the logical run it belongs to (`check --run-group`): the N shards of one check share it",
        "shard": "K/N when the run is shard K of N (`check --shard`), else NULL",
    },
    "results": {
        "run_id": "the run (joins runs.run_id)",
        "test_id": "test case id",
        "seed": "seed of the golden's inputs",
        "test_type": "op, module or pair",
        "suite": "suite file the test came from",
        "spec_hash": "hash of the expanded test definition",
        "tags": "test tags",
        "preset": "backend preset the result is for",
        "baseline": "preset the golden was recorded with",
        "status": "verdict: PASS, MISMATCH, EXPORT_FAIL, ... (opdiff's own files: OK or its error)",
        "export_ms": "export / conversion time, ms",
        "load_ms": "load time of the exported artifact, ms",
        "infer_ms": "median inference time over the repeats, ms",
        "infer_ms_all": "every timed repeat, ms",
        "cache_hit": "true when the exported artifact came from the cache",
        "batch": "how many tests one exporter call compiled this test's artifact with (its export_ms is its "
                 "share of that call); NULL: exported alone. Only a PASS comes from a batch's artifact",
        "error_class": "exception class of a failure",
        "error_message": "failure message",
        "delegation": "delegating presets (ExecuTorch with XNNPACK, CoreML, MPS): {delegate, blobs, ops: list of "
                      "{op, delegated, fallback, sources}}: per op, the nodes the delegate took and those left on "
                      "the runtime's kernels; NULL where nothing delegates",
        "unsupported_ops": "EXPORT_FAIL / LOAD_FAIL: every op the preset cannot lower, each tried alone "
                           "(list of {op, count, stage, error, signatures, sources, source_paths, modules}; "
                           "unnest it); NULL when not surveyed",
        "atol": "absolute tolerance used", "rtol": "relative tolerance used",
        "baseline_factor": "times the baseline's own rounding error a result may differ by",
        "precision_factor": "the multiple of torch eager's own fp16/bf16 error a composite output may reach, when "
                            "set (NULL: the precision's default, torch_factor)",
        "max_abs": "largest absolute difference", "mean_abs": "mean absolute difference",
        "mse": "mean squared error", "max_rel": "largest relative difference",
        "cosine": "cosine similarity of expected and actual",
        "mismatched": "number of elements outside tolerance",
        "mismatched_frac": "fraction of elements outside tolerance",
        "numel": "number of compared elements",
        "max_expected": "largest |expected| over the compared outputs (M, which the allowances scale with)",
        "min_atol": "smallest atol that would have passed (rtol kept)",
        "min_rtol": "smallest rtol that would have passed (atol kept; inf where an element beyond atol expects 0)",
        "sqnr": "10 log10(sum expected^2 / sum (actual - expected)^2) over the compared elements, dB (inf: equal)",
        "mean_dev": "mean signed deviation, mean(actual - expected)",
        "rel_l2": "relative L2 error, ||actual - expected|| / ||expected||",
        "outputs": "per floating output, in order: {output, numel, max_abs, min_atol, min_rtol, sqnr, mean_dev, "
                   "rel_l2} (UNNEST(outputs) for a row each)",
        "worst_index": "index of the worst element", "worst_output": "output holding it",
        "worst_expected": "expected value there", "worst_actual": "actual value there",
        "baseline_error": "largest |golden - float64 reference|: the baseline's own rounding error",
        "error_bound": "rounding allowance used (baseline_factor x that error, capped)",
        "within_rounding": "elements outside atol/rtol that passed within rounding",
        "bias": "mean of (actual - expected) over the output whose bias is the largest share of its bound",
        "bias_bound": "what that mean may be: 0.4 x the target's unit roundoff x max|expected| (x 8 on fp32), "
                      "or a t quantile of standard errors of it by the means of its rows",
        "drift": "mean error in target ulps there (each element's clipped to +-4; the larger of toward +inf and "
                 "away from zero)",
        "drift_bound": "what that mean may be: 0.75 ulps (x 8 on fp32), or more where its rows' means vary",
        "elementwise_ulps": "a single elementwise op on fp16/bf16: the largest error in target ulps against the "
                            "float64 result on target-rounded inputs",
        "failed_bound": "the bound a MISMATCH broke: nonfinite, exact, elementwise, normwise or bias",
        "torch_multiple": "fp16/bf16, composite outputs: the target's error against the float64 reference as a "
                          "multiple of torch eager's own at that precision (the larger of the RMS and largest-error "
                          "ratios; the worst output)",
        "torch_factor": "the multiple allowed there (within it, elements outside the tolerance are forgiven)",
        "as_torch": "elements outside every band that passed because the output is within torch_factor of torch's "
                    "own error",
        "allowance": "what the worst element was allowed",
        "steps": "int8: the lowering error allowed, in quantization steps of each output (NULL on presets that "
                 "do not quantize)",
        "min_sqnr": "int8: the smallest SQNR (dB) of the quantized model against the golden, when set; below it "
                    "the result is SQNR_LOW",
        "quant_sqnr": "int8: SQNR (dB) of the quantized reference (the model after quantization, before lowering) "
                      "against the fp32 golden: the quantization error",
        "lowering_sqnr": "int8: SQNR (dB) of the backend's outputs against the quantized reference",
        "lowering_steps": "int8: the backend's largest error against the quantized reference, in quantization "
                          "steps of that output (its dequantize scale, or max|reference|/127): the lowering error",
        "lowering_bias": "int8: the largest mean signed lowering error of an output, in its steps",
        "quant_step": "int8: one quantization step of the output with the largest lowering error",
        "quant_failed": "int8: which error failed the result: lowering (MISMATCH) or quantization (SQNR_LOW)",
        "calibration": "int8: sha256 (16 hex) of the calibration inputs the model was quantized from; equal "
                       "digests quantized from the same data",
        "expected": "the verdict the expectations file expects of the result (NULL: none that holds); status = "
                    "expected is a known failure, status != expected a known one that changed (a different "
                    "failure, or a pass); a failure with expected NULL is new",
        "precision_limited": "a MISMATCH on fp16/bf16 that torch eager at the same precision shares, by at least "
                             "half as much: look at the precision before the backend",
        "vacuous": "why the golden proves nothing (every output near zero, constant, or non-finite); NULL: it does",
        "ts": "when the result was written (UTC)",
        "file": "the JSONL file", "line": "1-based line in that file",
    },
    "verdicts": {
        "status": "a verdict (join results.status); one row per verdict, made from core/verdicts.py",
        "rank": "precedence, 1 = worst: the support matrix shows a cell's lowest rank",
        "kind": "its group: " + ", ".join(name for name, _ in KINDS),
        "passing": "the target matched, or record did its job ("
                   + ", ".join(v.value for v in PRECEDENCE if v in PASSING) + ")",
        "failing": "something failed; diff-runs: passing in A and failing in B is newly failing",
        "not_run": "the target did not run and nothing says it would fail; never newly failing or passing",
    },
}
