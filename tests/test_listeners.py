"""What a run tells its listener beyond each result (run/session.py): a RunListener hears
what it overrides and gets the defaults for the rest; a plain callable, or an object that
defines some of the methods itself, is heard the same way."""

from __future__ import annotations

import pytest

from opdiff_snap.run.session import RunListener, listening, notice, set_total, warn


def test_a_plain_function_gets_the_defaults():
    heard = []
    listener = heard.append
    notice(listener, "a note")
    set_total(listener, 3)
    with pytest.warns(RuntimeWarning, match="careful"):
        warn(listener, "careful")
    with pytest.warns(RuntimeWarning, match="nobody listens"):
        warn(None, "nobody listens")
    assert heard == []
    listening(listener)("a result")
    assert heard == ["a result"]


def test_an_object_with_some_of_the_methods_is_heard_through_them(recwarn):
    class Own:
        def __init__(self):
            self.said = []

        def __call__(self, result):
            self.said.append(("result", result))

        def notice(self, text):
            self.said.append(("notice", text))

        def set_total(self, total):
            self.said.append(("total", total))

    own = Own()
    notice(own, "a note")
    set_total(own, 7)
    with pytest.warns(RuntimeWarning, match="careful"):
        warn(own, "careful")   # it has no warn of its own
    assert own.said == [("notice", "a note"), ("total", 7)]


def test_a_subclass_hears_what_it_overrides(recwarn):
    class Warned(RunListener):
        def __init__(self):
            self.warnings = []

        def warn(self, text):
            self.warnings.append(text)

    listener = Warned()
    assert listening(listener) is listener
    warn(listener, "careful")
    notice(listener, "a note")   # the default: nothing
    set_total(listener, 2)
    assert listener.warnings == ["careful"] and not recwarn.list
