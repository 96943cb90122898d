"""Small ints that stand for a value within one process: tensor layouts and ATen overloads.

Recorded ops' keys hold them, because they are cheap to build and hash once per op. Each is an
int of its own type, so a key can be read back into the values it stands for: the program store
(cache/stored.py) keys programs on disk by that reading, where a plain int is always a value and
never an id that another process would give to something else.
"""
from __future__ import annotations


class LayoutId(int):
    """A tensor layout, (size, stride, dtype): `LAYOUTS[i]`."""

    __slots__ = ()


class FuncId(int):
    """An ATen overload (or another op deferfuse dispatches): `FUNCS[i]`."""

    __slots__ = ()


class OpId(int):
    """A graph op (graph.Op.id): no value of its own, so a key holding one is never stored."""

    __slots__ = ()


LAYOUTS: list[tuple] = []
_LAYOUT_IDS: dict[tuple, LayoutId] = {}
FUNCS: list = []


def layout_id(size: tuple, stride: tuple, dtype) -> LayoutId:
    key = (size, stride, dtype)
    i = _LAYOUT_IDS.get(key)
    if i is None:
        i = _LAYOUT_IDS[key] = LayoutId(len(LAYOUTS))
        LAYOUTS.append(key)
    return i


def func_id(func) -> FuncId:
    """A new id for `func` (the caller keeps it: record.FuncInfo, once per overload)."""
    FUNCS.append(func)
    return FuncId(len(FUNCS) - 1)
