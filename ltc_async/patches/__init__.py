"""One-time patching of torch at `import ltc_async`: the `ltc` device registration, kernels in
front of functionalization for host writes and collectives, in-place checks at Python entry
points, autocast, `module.to` ties, storage, fast paths and the optional native hooks.

Everything here installs something into torch once (`registration.register`); the per-op path
these patches lead to lives in `tensor/`.
"""
