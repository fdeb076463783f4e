"""Layers: each a thin call into the compiled ops (engine.ops)."""
