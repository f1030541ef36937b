"""TorchScript backend: IR -> `torch._C.Graph` of aten nodes -> TorchScript executor, on CPU or CUDA."""
from .backend import TorchScriptBackend as Backend

__all__ = ["Backend"]
