"""Measured memory of live Python objects: a ``sys.getsizeof`` walk (what the budget's per-entry constants were
measured with, and what the tests measure them against again)."""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterable
from typing import Any

#: Objects a walk never enters: code and the types, modules and functions every object refers to.
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)


def deep_size(roots: Iterable[Any], stop: Iterable[Any] = ()) -> int:
    """Bytes of ``roots`` and everything they reach, each object once, not entering ``stop`` (shared objects
    outside the structure measured: a manager, a target, settings) nor types, modules and functions."""
    seen = {id(x) for x in stop}
    stack = list(roots)
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total
