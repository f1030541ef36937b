"""The reference backend: the core IR interpreter on the CPU (see the package docstring)."""
from __future__ import annotations

from typing import Any

import torch

from ltc_async.backend import Backend, Computation
from ltc_async.ir.interpreter import Interpreter
from ltc_async.ir.node import Node


class ReferenceBackend(Backend):
    name = "reference"

    def parse_device(self, entry: str) -> torch.device:
        if entry.strip() != "cpu":
            raise ValueError(f"bad ltc_async device entry {entry!r}: the reference backend only has 'cpu'")
        return torch.device("cpu")

    def default_devices(self) -> list[str]:
        return ["cpu"]

    def upload(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        return tensor.to(device, copy=True)

    def to_torch(self, value: Any) -> torch.Tensor:
        return value

    def compile(self, order: list[Node], roots: list[tuple[Node, int]], device: torch.device) -> Computation:
        return Interpreter(order, roots, device)
