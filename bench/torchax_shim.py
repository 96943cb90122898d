"""Import torchax (the peer we compare against) on torch 2.13.

torchax 0.0.13 refers to a few ATen overloads that torch 2.13 no longer has (`prod.dim_Dimname`,
`all.dimname`, ...): its registry only names them, it never calls them on our workloads. While it
imports and builds its registry, a missing overload resolves to a stand-in of the same packet.
The benchmark runs torchax in a process of its own, so this never touches deferfuse's runs.
"""
from __future__ import annotations

import torch


def import_torchax(keep_lenient: bool = True):
    cls = torch._ops.OpOverloadPacket
    original = cls.__getattr__
    stood_in: list[str] = []

    def lenient(self, key):
        try:
            return original(self, key)
        except AttributeError:
            if key.startswith("__"):
                raise
            stood_in.append(f"{self._qualified_op_name}.{key}")
            return original(self, self.overloads()[0])

    cls.__getattr__ = lenient
    try:
        import torchax

        torchax.default_env()  # builds its op registry, which names the missing overloads too
    finally:
        if not keep_lenient:
            cls.__getattr__ = original
    return torchax, stood_in
