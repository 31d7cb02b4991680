"""Reference scheduler simulator and lifecycle model (standard library only)."""
