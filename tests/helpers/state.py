"""Compare whole object states: "bad input changes nothing" means every array and field is as it was."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np


def snapshot(obj: Any) -> Any:
    return copy.deepcopy(obj)


def assert_same_state(before: Any, after: Any, path: str = "state") -> None:
    if isinstance(before, np.ndarray):
        assert isinstance(after, np.ndarray) and before.shape == after.shape, path
        np.testing.assert_array_equal(before, after, err_msg=path)
    elif isinstance(before, dict):
        assert before.keys() == after.keys(), f"{path}: keys {sorted(before, key=str)} != {sorted(after, key=str)}"
        for key in before:
            assert_same_state(before[key], after[key], f"{path}[{key!r}]")
    elif isinstance(before, (list, tuple)):
        assert len(before) == len(after), f"{path}: length {len(before)} != {len(after)}"
        for i, (a, b) in enumerate(zip(before, after)):
            assert_same_state(a, b, f"{path}[{i}]")
    elif hasattr(before, "__dict__") and not callable(before):
        assert_same_state(vars(before), vars(after), f"{path}.")
    else:
        assert before == after, f"{path}: {before!r} != {after!r}"
