"""opdiff's own flags, so its users' commands keep working (README, "Coming from opdiff"):
one option group, parsed into `OpdiffFlags`, which says what each flag means for a run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from ..core.errors import OpdiffError
from ..core.limits import MAX_OPTIONS_FILE_BYTES
from ..core.regular_files import read_text_bounded
from .option_groups import SEED_COUNT, Group


@dataclass(frozen=True)
class OpdiffFlags:
    backends: str | None = None
    skips: str | None = None
    overrides_file: Path | None = None
    overrides_json: str | None = None
    num_sampled_inputs: int | None = None

    def presets(self) -> list[str]:
        """--backends 'A;B': the presets it names."""
        return [n.strip() for n in (self.backends or "").split(";") if n.strip()]

    def skip_pairs(self) -> list[tuple[str, str]]:
        """--skips 'ID:PRESET;...': the (test id or prefix*, preset or glob) pairs."""
        out = []
        for token in (t.strip() for t in (self.skips or "").split(";")):
            if not token:
                continue
            tid, sep, preset = (part.strip() for part in token.partition(":"))
            if not sep or not tid or not preset:
                raise OpdiffError(f"--skips '{token}': write TEST_ID:PRESET pairs separated by ';', e.g. "
                                  "'conv_*:onnx_cpu_fp16;gelu:*'.")
            out.append((tid, preset))
        return out

    def overrides(self) -> Any:
        """--backend-overrides-file/-json as what get_preset accepts (None if absent)."""
        file, inline = self.overrides_file, self.overrides_json
        if file is not None and inline is not None:
            raise OpdiffError("give --backend-overrides-file or --backend-overrides-json, not both.")
        if inline is not None:
            return inline
        if file is None:
            return None
        if file.suffix in (".yaml", ".yml"):
            return _yaml_overrides(file)
        return str(file)

    def seeds(self, seeds: int | None) -> int | None:
        """--seeds, or opdiff's --num-sampled-inputs (they must agree when both are given)."""
        n = self.num_sampled_inputs
        if n is not None and seeds is not None and seeds != n:
            raise OpdiffError(f"--seeds {seeds} and --num-sampled-inputs {n} disagree; give one.")
        return seeds if seeds is not None else n

    def selection(self, selection):
        """The selection with opdiff's seed count applied."""
        import dataclasses

        return dataclasses.replace(selection, seeds=self.seeds(selection.seeds))


def _yaml_overrides(file: Path) -> Any:
    """A YAML overrides file read as a suite is: a regular file, within the suite loader's
    size, nesting and alias-expansion bounds, as plain JSON values."""
    import json

    from ..suite.yamlload import YamlSyntaxError, load_yaml_text

    where = f"--backend-overrides-file {file}"
    text = read_text_bounded(file, MAX_OPTIONS_FILE_BYTES, "options file", where)
    try:
        data, _ = load_yaml_text(text)
        return json.loads(json.dumps(data)) if data is not None else {}
    except YamlSyntaxError as exc:
        raise OpdiffError(f"{where}: cannot read it as YAML ({exc}).") from None
    except (TypeError, ValueError) as exc:
        raise OpdiffError(f"{where}: options must be JSON values ({exc}).") from None


OPDIFF_FLAGS = Group("opdiff", (
    click.option("--backends", "opdiff_backends", metavar="'A;B'", help="opdiff's form of -b: ';'-separated presets."),
    click.option("--skips", "opdiff_skips", metavar="'ID:PRESET;...'",
                 help="Skip these (test id or prefix*, preset or glob) pairs: SKIPPED with the reason."),
    click.option("--backend-overrides-file", "opdiff_overrides_file", type=click.Path(path_type=Path),
                 help="opdiff's per-preset options file (JSON or YAML: {preset: {options}})."),
    click.option("--backend-overrides-json", "opdiff_overrides_json",
                 help="opdiff's per-preset options as inline JSON."),
    click.option("--num-sampled-inputs", "opdiff_num_sampled_inputs", type=SEED_COUNT,
                 help="opdiff's name for --seeds."),
), lambda values: OpdiffFlags(**{k.removeprefix("opdiff_"): v for k, v in values.items()}))
