"""Grading student submissions: ``cbatch grade`` (see ``driver``), rubrics, Gradescope results.

Every submission runs in a sandbox child process (``pytest_cbatch.sandbox``);
every verdict is the ordinary ``runner.Judge`` / lifecycle / numerics verdict,
computed in the grader's own process.
"""

from .driver import discover, grade_all, main
from .evaluate import Submission, grade_submission
from .plan import Plan, build_plan
from .rubric import Rubric, load_rubric

__all__ = ["Plan", "Rubric", "Submission", "build_plan", "discover", "grade_all", "grade_submission",
           "load_rubric", "main"]
