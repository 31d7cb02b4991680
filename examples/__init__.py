"""Example adapters, broken schedulers and grading recipes."""
