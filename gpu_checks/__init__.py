"""Batched-vs-unbatched logits checks on a small seeded transformer (needs torch)."""
