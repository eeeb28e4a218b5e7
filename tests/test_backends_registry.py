"""Preset registry: names, resolved options, overrides, availability, entry-point plugins."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

from opdiff_snap.backends.base import Artifact, Backend
from opdiff_snap.backends.registry import (
    all_presets,
    availability,
    backend_for,
    get_preset,
    plugin_errors,
    preset_names,
    reload_plugins,
    requirements,
)
from opdiff_snap.cli import main
from opdiff_snap.core.errors import OpdiffError

BUILT_IN_PRESETS = (
    [f"torch_{d}_{p}" for d in ("cpu", "cuda", "mps") for p in ("fp32", "fp16", "bf16")]
    + [f"inductor_{d}_{p}" for d in ("cpu", "cuda") for p in ("fp32", "fp16", "bf16")]
    + [f"onnx_{d}_{p}" for d in ("cpu", "cuda", "coreml") for p in ("fp32", "fp16")]
    + [f"executorch_{d}_{p}" for d in ("cpu", "portable", "mps", "coreml") for p in ("fp32", "fp16")]
    + [f"coreml_{d}_{p}" for d in ("cpu", "gpu", "ane", "any") for p in ("fp32", "fp16")]
    # int8 only where the family's quantizer targets the device
    + [f"{f}_cpu_{p}" for f in ("onnx", "executorch") for p in ("int8", "int8pt", "int8dyn")]
    + ["inductor_cpu_int8", "inductor_cpu_int8dyn"]
    # CoreML: static int8 on every device (its activations have no dynamic quantization)
    + [f"coreml_{d}_{p}" for d in ("cpu", "gpu", "ane", "any") for p in ("int8", "int8pt")]
)


def test_every_built_in_preset_is_listed_and_nothing_else():
    assert sorted(preset_names()) == sorted(BUILT_IN_PRESETS)


def test_presets_are_well_formed_and_their_options_are_json():
    for preset in all_presets():
        assert preset.name == f"{preset.family}_{preset.device}_{preset.precision}"
        assert isinstance(backend_for(preset), Backend)
        assert json.loads(json.dumps(preset.to_json()))["options"] == dict(preset.options)


def test_options_that_follow_from_the_name_are_resolved():
    assert get_preset("onnx_cuda_fp16").options["providers"] == ["CUDAExecutionProvider"]
    assert get_preset("coreml_ane_fp16").options["compute_units"] == "CPU_AND_NE"
    assert get_preset("coreml_ane_fp16").options["compute_precision"] == "FLOAT16"
    assert get_preset("executorch_cpu_fp16").options["export_fp16"] is True
    # opdiff: executorch_coreml_fp16 exports fp32 and lets CoreML compute in fp16
    coreml_et = get_preset("executorch_coreml_fp16").options
    assert coreml_et["export_fp16"] is False and coreml_et["coreml_compute_precision"] == "fp16"


def test_unknown_preset_suggests_the_nearest_names():
    with pytest.raises(OpdiffError, match="onnx_cpu_fp32"):
        get_preset("onnx_cpu_fp23")
    with pytest.raises(OpdiffError, match="unknown backend preset 'tensorrt_gpu_fp32'"):
        get_preset("tensorrt_gpu_fp32")


def test_overrides_as_dict_json_string_and_file(tmp_path):
    assert get_preset("onnx_cpu_fp32", {"opset": 18}).options["opset"] == 18
    assert get_preset("onnx_cpu_fp32", '{"opset": 17, "dynamo": false}').options["dynamo"] is False
    path = tmp_path / "over.json"
    path.write_text(json.dumps({"opset": 19}))
    assert get_preset("onnx_cpu_fp32", str(path)).options["opset"] == 19
    assert get_preset("onnx_cpu_fp32", path).options["opset"] == 19
    # defaults are not mutated by an override
    assert get_preset("onnx_cpu_fp32").options["opset"] == 20


def test_opdiff_override_shapes_keep_working(tmp_path):
    # opdiff's examples/backend_overrides.json: per preset, per section
    per_preset = {"onnx_cpu_fp32": {"onnx_overrides": {"opset": 18}},
                  "coreml_any_fp16": {"coreml_overrides": {"minimum_ios_target": "iOS17"}}}
    path = tmp_path / "backend_overrides.json"
    path.write_text(json.dumps(per_preset))
    assert get_preset("onnx_cpu_fp32", path).options["opset"] == 18
    assert get_preset("onnx_cpu_fp16", path).options["opset"] == 20  # no entry: defaults
    assert get_preset("coreml_any_fp16", path).options["minimum_deployment_target"] == "iOS17"
    assert get_preset("executorch_cpu_fp32", {"torch_export_overrides": {"export_strict": True}}
                      ).options["export_strict"] is True


def test_unknown_or_mistyped_option_names_the_key():
    with pytest.raises(OpdiffError, match=r"unknown option 'opsett'.*did you mean 'opset'"):
        get_preset("onnx_cpu_fp32", {"opsett": 18})
    with pytest.raises(OpdiffError, match=r"option 'opset' expects int"):
        get_preset("onnx_cpu_fp32", {"opset": "eighteen"})
    with pytest.raises(OpdiffError, match=r"option 'fullgraph' expects bool"):
        get_preset("inductor_cpu_fp32", {"fullgraph": 1})
    with pytest.raises(OpdiffError, match=r"'onnx_cpu_fp3' is not a preset name"):
        get_preset("onnx_cpu_fp32", {"onnx_cpu_fp32": {}, "onnx_cpu_fp3": {}})
    with pytest.raises(OpdiffError, match="not valid JSON"):
        get_preset("onnx_cpu_fp32", "{opset: 18}")
    with pytest.raises(OpdiffError, match="neither a JSON object nor an existing"):
        get_preset("onnx_cpu_fp32", "no/such/file.json")


def test_availability_on_this_machine_explains_every_no():
    for preset in all_presets():
        avail = availability(preset)
        if not (avail.can_export and avail.can_run):
            assert avail.reason, preset.name
    assert availability(get_preset("torch_cpu_fp32")).can_run
    if sys.platform != "darwin":
        coreml = availability(get_preset("coreml_any_fp32"))
        assert coreml.can_export and not coreml.can_run and "macOS" in coreml.reason
        assert not availability(get_preset("executorch_coreml_fp32")).can_run
    if not torch.cuda.is_available():
        assert not availability(get_preset("torch_cuda_fp32")).can_run
        assert "CUDA" in availability(get_preset("inductor_cuda_fp16")).reason
        onnx_cuda = availability(get_preset("onnx_cuda_fp32"))
        assert onnx_cuda.can_export and not onnx_cuda.can_run and "CUDAExecutionProvider" in onnx_cuda.reason


# ---------------------------------------------------------------- entry-point plugins

PLUGIN_SOURCE = textwrap.dedent('''
    import torch
    from opdiff_snap.backends.base import Artifact, Availability, Backend

    class ToyBackend:
        """A real (tiny) backend: eager torch, scaled by a factor from its options."""
        family = "toy"
        devices = ("cpu",)
        precisions = ("fp32", "fp16")
        default_options = {"scale": 1.0}
        serializes = False
        can_differentiate = False

        def availability(self, preset):
            return Availability(True, True)

        def export(self, module, inputs, preset, workdir):
            return Artifact(obj=module)

        def load(self, artifact, preset, threads=0):
            scale = preset.options["scale"]
            def run(inputs):
                out = artifact.obj(*inputs)
                return [t * scale for t in ((out,) if isinstance(out, torch.Tensor) else out)]
            return run

    def make_other():
        backend = ToyBackend()
        backend.family = "toy2"
        return backend

    class NotABackend:
        family = "half"

    class NoLoad:
        family = "noload"
        devices = ("cpu",)
        precisions = ("fp32",)
        default_options = {}
        serializes = False
        can_differentiate = False

        def availability(self, preset):
            return Availability(True, True)

        def export(self, module, inputs, preset, workdir):
            return Artifact(obj=module)

    class SubclassWithoutExport(Backend):
        family = "noexport"
        devices = ("cpu",)
        precisions = ("fp32",)
        default_options = {}
        serializes = False
        can_differentiate = False

        def availability(self, preset):
            return Availability(True, True)

        def load(self, artifact, preset, threads=0):
            return artifact.obj

    class RequiresASet(ToyBackend):
        family = "wrongrequires"
        requires = frozenset({"cuda"})

    class AliasesAList(ToyBackend):
        family = "wrongaliases"
        option_aliases = ["factor"]

    class Routed(ToyBackend):
        family = "routed"
        option_aliases = {"factor": "scale"}
        repro_source = None

        def requires(self, preset):
            return frozenset({"cuda"})
''')

ENTRY_POINTS = textwrap.dedent('''
    [opdiff_snap.backends]
    toy = toy_plugin:ToyBackend
    toy2 = toy_plugin:make_other
    half = toy_plugin:NotABackend
    broken = toy_plugin_missing:Backend
    noload = toy_plugin:NoLoad
    noexport = toy_plugin:SubclassWithoutExport
    wrongrequires = toy_plugin:RequiresASet
    wrongaliases = toy_plugin:AliasesAList
    routed = toy_plugin:Routed
''')


@pytest.fixture
def plugin_dist(tmp_path, monkeypatch):
    (tmp_path / "toy_plugin.py").write_text(PLUGIN_SOURCE)
    info = tmp_path / "toy_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    reload_plugins()
    yield
    monkeypatch.undo()
    sys.modules.pop("toy_plugin", None)
    reload_plugins()


def test_entry_point_backends_register_their_presets(plugin_dist, tmp_path):
    names = preset_names()
    assert {"toy_cpu_fp32", "toy_cpu_fp16", "toy2_cpu_fp32"} <= set(names)
    preset = get_preset("toy_cpu_fp32", {"scale": 2.0})
    assert preset.options == {"scale": 2.0}
    backend = backend_for(preset)
    run = backend.load(backend.export(torch.nn.ReLU(), (), preset, tmp_path), preset)
    x = torch.tensor([-1.0, 3.0])
    assert torch.equal(run([x])[0], torch.tensor([0.0, 6.0]))
    with pytest.raises(OpdiffError, match="unknown option 'scal'"):
        get_preset("toy_cpu_fp32", {"scal": 2})


def test_a_broken_entry_point_is_named_and_breaks_nothing_else(plugin_dist):
    errors = " ".join(plugin_errors())
    assert "backend plugin 'broken'" in errors and "toy_plugin_missing" in errors
    assert "backend plugin 'half'" in errors and "lacks" in errors
    assert "onnx_cpu_fp32" in preset_names()  # built-ins unaffected
    with pytest.raises(OpdiffError, match=r"backend plugin 'broken'.*failed to load"):
        get_preset("broken_cpu_fp32")


def test_a_plugin_missing_a_required_member_is_refused_naming_the_plugin_and_the_member(plugin_dist, tmp_path,
                                                                                       monkeypatch):
    errors = " ".join(plugin_errors())
    assert "backend plugin 'noload' (toy_plugin:NoLoad" in errors
    with pytest.raises(OpdiffError, match=r"backend plugin 'noload' .*lacks load of the Backend protocol"):
        get_preset("noload_cpu_fp32")
    # a subclass of Backend that leaves a required method to the base is refused the same way
    with pytest.raises(OpdiffError, match=r"backend plugin 'noexport' .*lacks export of the Backend protocol"):
        get_preset("noexport_cpu_fp32")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["check", "-b", "noload_cpu_fp32"])
    assert res.exit_code == 2, res.output
    assert "backend plugin 'noload'" in res.output and "lacks load" in res.output
    assert "Traceback" not in res.output


def test_a_plugin_with_an_optional_member_of_the_wrong_kind_is_refused_naming_it(plugin_dist, tmp_path,
                                                                                monkeypatch):
    with pytest.raises(OpdiffError, match=r"backend plugin 'wrongrequires' .*its 'requires' must be a method"
                                          r".*not frozenset"):
        get_preset("wrongrequires_cpu_fp32")
    with pytest.raises(OpdiffError, match=r"backend plugin 'wrongaliases' .*its 'option_aliases' must be a "
                                          r"mapping.*not list"):
        get_preset("wrongaliases_cpu_fp32")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["check", "-b", "wrongrequires_cpu_fp32"])
    assert res.exit_code == 2, res.output
    assert "backend plugin 'wrongrequires'" in res.output and "'requires' must be a method" in res.output


def test_a_plugin_that_does_not_subclass_backend_gets_the_declared_defaults(plugin_dist):
    toy = backend_for(get_preset("toy_cpu_fp32"))
    assert isinstance(toy, Backend)
    preset = get_preset("toy_cpu_fp32")
    assert requirements(preset) == frozenset()
    assert toy.delegation(Artifact(), preset) is None
    assert toy.option_aliases == {} and toy.option_ranges == {}
    assert toy.repro_source == "" and toy.repro_needs == ""
    routed = get_preset("routed_cpu_fp32", {"factor": 3.0})
    assert routed.options == {"scale": 3.0}   # its own alias
    assert requirements(routed) == frozenset({"cuda"})
    assert backend_for(routed).repro_source == ""   # None: left out


def test_without_the_plugin_its_presets_are_gone():
    assert not any(n.startswith("toy") for n in preset_names())
