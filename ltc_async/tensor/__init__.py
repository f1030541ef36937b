"""The per-op path: what every aten call on an `ltc` tensor goes through.

`lazy_tensor` (the tensor) -> `dispatch` (the route of each op) -> `trace` + `shapes` (one IR
node) or a path of its own: `special`, `decompositions`, `strided`, `data_dependent`,
`composites` (handlers, registered with `dispatch` when they load, below), `host` (eager
fallbacks, uploads, reads), `collectives` (c10d ops queued on the device); `writeback` is the
one way a value is written into a user's tensor below functionalization.  The one-time
patching of torch that leads here lives in `patches/`.
"""
from . import composites, data_dependent, decompositions, dispatch, special, strided  # noqa: F401 - handlers register
