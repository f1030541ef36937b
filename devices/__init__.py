"""ltc_async backends, installed as the `ltc_async_devices` package and found by name.

Each backend is a subpackage exposing a `Backend` class implementing `ltc_async.backend.Backend`.
"""
