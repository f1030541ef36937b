"""Foundations every layer may use: configuration, counters, the event bus, call-site lookup.

Nothing here imports another part of ltc_async (see DESIGN.md, "Layers").
"""
