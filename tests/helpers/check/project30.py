"""Fixtures of the tests that check suite30.yaml with the perturbing backend
(`pytest_plugins = ["helpers.check.project30"]`): the backend's site, the project recorded
once per module, a fresh copy of it per test."""

from __future__ import annotations

import pytest

from . import copy_project, make_site, recorded_suite30


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return make_site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return recorded_suite30(tmp_path_factory.mktemp("p30"))


@pytest.fixture
def project(recorded, tmp_path):
    return copy_project(recorded, tmp_path / "p")
