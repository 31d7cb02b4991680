"""``python -m gpu_checks`` (from a checkout) or ``python -m pytest_cbatch.gpu_checks``."""

import sys

from .cli import main

sys.exit(main(prog="python -m gpu_checks"))
