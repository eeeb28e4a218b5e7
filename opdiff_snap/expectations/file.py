"""The expectations file: read and validated like a suite (every problem at once, with
file and line), and written back in one canonical form, one line per entry, so that an
update's diff is exactly the entries it changed.

    # presets (or globs of presets), each with its tests' expected verdicts
    onnx_cpu_fp32:
      - {test: erfinv, verdict: EXPORT_FAIL, reason: "no Erfinv kernel in ONNX Runtime"}
      - {test: "nn_conv2d_same*", verdict: MISMATCH, seed: 0, until: "onnxruntime<1.32"}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..core.errors import OpdiffError, Problem, SuiteError, suggest
from ..core.limits import MAX_SEED
from ..core.safetext import printable
from ..core.verdicts import PASSING, Verdict
from ..suite.problems import Problems, Where, check_keys
from ..suite.yamlload import YamlSyntaxError, load_yaml_text, read_yaml_file
from . import parsed_cache
from .entries import Expectation, Expectations, bracket_problem, is_glob

KEYS = ("test", "verdict", "reason", "seed", "until")
EXPECTABLE = tuple(v.value for v in Verdict if v not in PASSING)
HEADER = ("# Results known not to pass, per preset (or glob of presets): each test (or glob of tests),\n"
          "# optionally one seed, the verdict it gets, why, and `until`: the versions it holds for.\n"
          "# `opdiff check ... --update-expectations` rewrites the entries of what it checked.\n")


class ExpectationsError(SuiteError):
    """Every problem of one expectations file."""

    def __init__(self, problems: list[Problem]):
        super().__init__(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in the expectations file (nothing ran):"
        self.args = ("\n".join([head] + [f"  - {p}" for p in self.problems]),)


def load(path: Path | str, presets: list[str], cache: Path | None = None) -> Expectations:
    """The expectations in `path`, every entry checked against the preset names known
    (`presets`); raises ExpectationsError with every problem, OpdiffError when the file
    cannot be read. `cache`: a local folder where the parsed file is kept for the next
    load of the same text (parsed_cache.py)."""
    path = Path(path)
    try:
        text = read_text(path)
    except YamlSyntaxError as exc:
        raise _syntax_error(path, exc) from None
    text_digest = digest(text.encode("utf-8"))
    kept = parsed_cache.read(cache, text_digest, presets) if cache is not None else None
    if kept is not None:
        return Expectations(kept, str(path), digest=text_digest)
    found = _parse(path, text, text_digest, presets)
    if cache is not None:
        parsed_cache.write(cache, text_digest, presets, found.entries)
    return found


def _parse(path: Path, text: str, text_digest: str, presets: list[str]) -> Expectations:
    problems = Problems()
    root = Where(str(path))
    try:
        data, duplicates = load_yaml_text(text)
    except YamlSyntaxError as exc:
        raise _syntax_error(path, exc) from None
    for message, mark in duplicates:
        problems.add(Where(str(path), mark=mark), message)
    found = Expectations([], str(path), digest=text_digest)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        problems.add(root, "the file must be a mapping of preset names (or globs) to lists of expectations, "
                           f"not a {type(data).__name__}")
        raise ExpectationsError(list(problems))
    seen: dict[tuple[str, str, int | None], int | None] = {}
    for preset, entries in data.items():
        where = root.key(data, preset)
        if not isinstance(preset, str) or not preset:
            problems.add(where, f"a preset name (or glob) must be a string, not {preset!r}")
            continue
        preset_problem = _preset_problem(preset, presets)
        if preset_problem:
            problems.add(where, preset_problem)
        at = root.at(data, preset)
        if not isinstance(entries, list):
            problems.add(at, f"the expectations of '{preset}' must be a list of mappings like "
                             "{test: ID, verdict: EXPORT_FAIL, reason: TEXT}")
            continue
        for i, raw in enumerate(entries):
            entry = _entry(preset, raw, at.at(entries, i), problems)
            if entry is None or preset_problem:
                continue
            line = entry.line
            if entry.key in seen:
                problems.add(at.at(entries, i), f"duplicate expectation: '{entry.test}' on '{preset}'"
                             + (f" at seed {entry.seed}" if entry.seed is not None else "")
                             + f" is already expected on line {seen[entry.key]}; keep one")
                continue
            seen[entry.key] = line
            found.entries.append(entry)
    if len(problems):
        raise ExpectationsError(list(problems))
    return found


def _syntax_error(path: Path, exc: YamlSyntaxError) -> ExpectationsError:
    problems = Problems()
    for message, mark in exc.problems:
        problems.add(Where(str(path), mark=mark), message)
    return ExpectationsError(list(problems))


def digest(data: bytes) -> str:
    """What tells one text of the file from another (an update reads the file again)."""
    import hashlib

    return hashlib.sha256(data).hexdigest()


def read_text(path: Path) -> str:
    """The file's text, bounded; raises OpdiffError when it cannot be read, YamlSyntaxError
    when it is too big or not UTF-8."""
    try:
        return read_yaml_file(path, "an expectations file")
    except OSError as exc:
        raise OpdiffError(f"cannot read the expectations file {path}: {exc.strerror or exc}. Give an existing "
                          "file (--expectations, or `expectations` under [tool.opdiff]), or create it with "
                          "`opdiff check ... --update-expectations`.") from None


def refuse_globs_naming_no_test(expectations: Expectations, test_ids: Iterable[str], among: str) -> None:
    """Raise ExpectationsError naming every entry whose test glob matches none of
    `test_ids`, every test of the project (`among` says where they are): such an entry
    excuses nothing, and is most likely a typo."""
    problems = [Problem(expectations.path, f"the test glob '{printable(e.test)}' matches no test {among}; fix the "
                        "glob or remove the entry (`opdiff list-tests` lists the ids)", line=e.line)
                for e in expectations.naming_no_test(test_ids)]
    if problems:
        raise ExpectationsError(problems)


def _preset_problem(preset: str, presets: list[str]) -> str:
    if is_glob(preset):
        import fnmatch

        if why := bracket_problem(preset):
            return f"'{preset}' is not a valid glob ({why})"
        if not any(fnmatch.fnmatchcase(p, preset) for p in presets):
            return f"the glob '{preset}' matches no preset (`opdiff list-presets` lists them)"
        return ""
    if preset not in presets:
        return f"unknown preset '{preset}'{suggest(preset, presets)} (`opdiff list-presets` lists them)"
    return ""


def _entry(preset: str, raw: Any, where: Where, problems: Problems) -> Expectation | None:
    if not isinstance(raw, dict):
        problems.add(where, "an expectation must be a mapping like {test: ID, verdict: EXPORT_FAIL, reason: TEXT}")
        return None
    before = len(problems)
    check_keys(raw, KEYS, where, problems, "an expectation")
    test = raw.get("test")
    if not isinstance(test, str) or not test:
        problems.add(where.at(raw, "test") if "test" in raw else where,
                     "'test' (a test id, or a glob of ids) is required and must be a string")
    elif why := bracket_problem(test):
        problems.add(where.at(raw, "test"), f"'{test}' is not a valid glob ({why})")
    verdict = raw.get("verdict")
    if not isinstance(verdict, str) or verdict.upper() not in EXPECTABLE:
        got = "missing" if verdict is None else repr(verdict)
        problems.add(where.at(raw, "verdict") if "verdict" in raw else where,
                     f"'verdict' is {got}; it must be one of {', '.join(EXPECTABLE)}"
                     + (suggest(str(verdict).upper(), EXPECTABLE) if verdict is not None else ""))
    reason = raw.get("reason", "")
    if not isinstance(reason, str):
        problems.add(where.at(raw, "reason"), "'reason' must be text (why, or a link)")
    seed = raw.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED):
        problems.add(where.at(raw, "seed"), f"'seed' must be a whole number from 0 to {MAX_SEED} (the "
                                            f"history's 64-bit seeds), not {seed!r}")
    until = raw.get("until", "")
    if until:
        why = _range_problem(until)
        if why:
            problems.add(where.at(raw, "until"), why)
    if len(problems) > before:
        return None
    line = where.mark[0] if where.mark else None
    return Expectation(preset, str(test), Verdict(str(verdict).upper()), str(reason), seed, str(until or ""), line)


def _range_problem(until: Any) -> str:
    if not isinstance(until, str):
        return f"'until' must be a version range such as \"onnxruntime<1.32\", not {until!r}"
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(until)
    except InvalidRequirement:
        return f"'until' {until!r} is not a version range such as \"onnxruntime<1.32\" or \"torch>=2.12,<2.14\""
    if not req.specifier or req.extras or req.marker or req.url:
        return (f"'until' {until!r} must name one package and its versions, such as \"onnxruntime<1.32\" "
                "(no extras, markers or URLs)")
    return ""


def dump(expectations: Expectations) -> str:
    """The file's text: presets in the order their first entry comes (new ones after the
    file's own); within each, entries sorted by test and seed; one line each."""
    by_preset: dict[str, list[Expectation]] = {}
    for e in expectations.entries:
        by_preset.setdefault(e.preset, []).append(e)
    lines = [HEADER.rstrip("\n")]
    for preset, entries in by_preset.items():
        lines.append(f"{_scalar(preset)}:")
        for e in sorted(entries, key=lambda x: (x.test, -1 if x.seed is None else x.seed)):
            fields = [f"test: {_scalar(e.test)}", f"verdict: {e.verdict.value}"]
            if e.seed is not None:
                fields.append(f"seed: {e.seed}")
            if e.until:
                fields.append(f"until: {_scalar(e.until)}")
            if e.reason:
                fields.append(f"reason: {_scalar(e.reason)}")
            lines.append("  - {" + ", ".join(fields) + "}")
    return "\n".join(lines) + "\n"


def _scalar(text: str) -> str:
    """`text` as a YAML flow scalar that reads back as `text`: plain where that reads back
    the same, else double-quoted with every character that is not printable escaped (the
    C0 and C1 controls, YAML's other line breaks NEL, U+2028 and U+2029, the BOM, bidi
    controls and noncharacters: raw, YAML refuses some and folds others). A lone
    surrogate, which YAML cannot hold even escaped, is refused (OpdiffError)."""
    import yaml

    if text and all(c.isalnum() or c in "_.-" for c in text) and yaml.safe_load(text) == text:
        return text
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return '"' + "".join(_ESCAPES.get(c) or (c if c.isprintable() else _escape(ord(c))) for c in text) + '"'


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t"}


def _escape(code: int) -> str:
    if 0xD800 <= code < 0xE000:
        raise OpdiffError(f"--update-expectations: a test id or reason holds a lone surrogate (U+{code:04X}), which "
                          "no YAML file can hold; rename the test (or fix the reason) and run again.")
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
