"""Fixtures for every test folder (a folder's own are in its conftest.py; plain helpers in tests/helpers/)."""

from __future__ import annotations

import pytest

from tests.helpers.model_directory import write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """The tiny random Llama of tests/helpers/model_directory.py, written once per test module."""
    return str(write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny"))
