"""The benchmarks (see benchmarks/README.md).  Run each one as a module from the repository
root, e.g. `python -m benchmarks.bench_lazy --quick`; they share `harness` (the round-robin
runner, timing, results, Markdown tables, machine info), `engines` (eager, torch._lazy,
ltc_async, torch.compile) and `cases` (the MLP, its training step, the chain workload and the
real-workload suite's model cases, imported from `tests.models.test_models`)."""
