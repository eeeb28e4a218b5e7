"""`opdiff upgrade --with`: each value is parsed as a requirement and must be an exact
NAME==VERSION pin from an index. A second line, an installer option, a direct URL, a
marker or a range is refused while the flags are parsed (exit 2, naming the flag), before
any environment is built; and what reaches pip or uv is only our own flags and files
holding the requirements as parsed and written back, never text a user typed.

No environment is built here (that takes minutes); test_upgrade.py builds one."""

from __future__ import annotations

import pytest
from helpers.cli import invoke
from helpers.hostile import assert_clean_failure, snapshot

from opdiff_snap.core.errors import OpdiffError
from opdiff_snap.execution import workerenvs
from opdiff_snap.execution.workerenvs import (
    Requirements,
    install_steps,
    parse_with,
    requirement_lines,
    requirements_for,
)

REFUSED = [
    ("onnxruntime==1.30\n--index-url http://127.0.0.1:9/simple", "not a requirement"),
    ("onnxruntime==1.30\n-ihttp://127.0.0.1:9/simple", "not a requirement"),
    ("onnxruntime==1.30.0 -ihttp://127.0.0.1:9/simple", "not a requirement"),
    ("--index-url=http://127.0.0.1:9/simple", "an installer option is not a requirement"),
    ("-r/etc/passwd", "an installer option is not a requirement"),
    ("-e.", "an installer option is not a requirement"),
    ("onnxruntime @ http://127.0.0.1:9/onnxruntime-1.30.0.whl", "a direct URL is not installed"),
    ("onnxruntime @ file:///tmp/onnxruntime-1.30.0.whl", "a direct URL is not installed"),
    ("onnxruntime==1.30.0; sys_platform == 'linux'", "an environment marker does not belong here"),
    ("onnxruntime>=1.30", "give an exact pin, NAME==VERSION"),
    ("onnxruntime==1.*", "give an exact pin, NAME==VERSION"),
    ("onnxruntime", "give an exact pin, NAME==VERSION"),
]


@pytest.mark.parametrize("value, fragment", REFUSED, ids=[repr(v) for v, _ in REFUSED])
def test_with_takes_only_an_exact_pin(tmp_path, value, fragment):
    """The folder has no goldens, so anything past the flags would fail differently; nothing
    (no cache, no environment) is written."""
    project = tmp_path / "p"
    project.mkdir()
    before = snapshot(project)
    code, out, err = invoke(project, "upgrade", "--with", value, "-b", "onnx_cpu_fp32")
    assert_clean_failure(code, out, err, 2, f"opdiff: error: --with {value!r}: {fragment}")
    assert len(err.strip().splitlines()) == 1, err
    assert snapshot(project) == before


def test_installer_gets_only_requirements_written_back(tmp_path, monkeypatch):
    """Spelled loosely on the command line, the pins reach the requirements file in their
    parsed form; the command lines hold our flags and paths only."""
    monkeypatch.setattr(workerenvs, "pip_index_options", lambda: ["--index-url", "https://index.example/simple"])
    named = parse_with([" ONNX_Runtime == 1.30.0 ", "torch[opt]==2.13.0+cpu"])
    reqs = requirements_for(named, ["onnx"])
    install, constraints = requirement_lines(reqs)
    assert install == [reqs.install[0], "ONNX_Runtime==1.30.0", "torch[opt]==2.13.0+cpu"]   # first: this opdiff-snap
    assert [c for c in constraints if c.startswith("numpy==")]        # this environment's pins ...
    assert not [c for c in constraints if c.startswith(("-", "torch=="))]   # ... but the named ones
    root = tmp_path / "env"
    files = ["-c", str(root / "constraints.txt"), "-r", str(root / "requirements.txt")]
    pip = install_steps(reqs, root, None)
    assert pip[1] == [str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                      "--progress-bar", "off", *files]
    uv = install_steps(reqs, root, "/usr/bin/uv")
    assert uv[1] == ["/usr/bin/uv", "pip", "install", "--python", str(root / "venv" / "bin" / "python"),
                     "--index-url", "https://index.example/simple", *files]
    for cmd in pip + uv:
        assert not [arg for arg in cmd if "1.30.0" in arg or "ONNX" in arg or "torch" in arg], cmd


def test_a_requirement_set_holding_an_option_is_not_written(tmp_path):
    """Built by hand through the API, a requirement set whose pins hold installer options
    is refused before its files are written."""
    reqs = Requirements(("-e .", "onnxruntime==1.30\n-ihttp://127.0.0.1:9/simple"), ("numpy==2.4.6",), "3.11")
    with pytest.raises(OpdiffError, match="not a requirement"):
        requirement_lines(reqs)
    reqs = Requirements(("-e .", "onnxruntime==1.30.0"), ("--extra-index-url=http://127.0.0.1:9/simple",), "3.11")
    with pytest.raises(OpdiffError, match="an installer option is not a requirement"):
        requirement_lines(reqs)
