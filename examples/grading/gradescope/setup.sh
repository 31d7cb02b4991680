#!/usr/bin/env bash
# Gradescope runs this once when it builds the autograder image.
set -euo pipefail
apt-get update
# bubblewrap contains each submission: without it `cbatch grade --gradescope` refuses to grade, since a
# submission running as a plain process could rewrite /autograder/results/results.json.
apt-get install -y python3 python3-pip bubblewrap
pip3 install /autograder/source/pytest_cbatch-*.whl
