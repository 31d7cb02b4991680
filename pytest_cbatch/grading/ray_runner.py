"""``cbatch grade --ray ADDRESS``: each submission a Ray task, graded in the sandbox of the worker it lands on.

Only this module imports ray, and only when ``--ray`` is given.  The driver
packs each submission into a ``bundle.Bundle`` (its bytes; no file system is
shared), and submits one task per submission asking for one CPU and the
memory the rubric's limits imply (``task_resources``).  On the worker the task
checks that it can grade as the driver would (the same kit version; the
sandbox the rubric requires), unpacks the bundle into a temporary folder,
validating it as untrusted input, grades it exactly as one machine does, and
returns the result with the files written beside results.json.  The driver
checks what comes back and writes ``OUT/<name>/`` itself, so OUT is what a
one-machine run writes.  A worker or node lost mid-task makes Ray run the
task again elsewhere (``MAX_RETRIES``); each submission's result is taken
once, when its task finishes, so none is lost or reported twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..sandbox import resolve_mode
from .bundle import MAX_BUNDLE_BYTES, Bundle, BundleError, pack, plain_name, unpack
from .evaluate import Submission
from .plan import Plan
from .progress import HEARTBEAT_SECONDS
from .results import SubmissionResult
from .rubric import Rubric
from .shards import kit_version

__all__ = ["GRADER_MEMORY_MB", "MAX_RETRIES", "Returned", "WorkerRefused", "grade_on_ray", "grade_remote",
           "task_resources"]

GRADER_MEMORY_MB = 512      # the grading process itself: the judge, hypothesis, the plan
MAX_RETRIES = 3             # times a task is run again after its worker or node is lost
_MAX_RETURNED_FILES = 1000
LOCAL_OBJECT_STORE = 256 << 20

GradeOne = Callable[[Submission, Rubric, Plan, Path, str], SubmissionResult]
Discover = Callable[[Path], list[Submission]]


class WorkerRefused(RuntimeError):
    """This worker cannot grade as the run requires (no bubblewrap where it is required, another kit version)."""


@dataclass(frozen=True)
class Returned:
    """What a task sends back: the result and the files written beside results.json (results.json among them)."""

    result: SubmissionResult
    files: tuple[tuple[str, bytes], ...]


def task_resources(rubric: Rubric) -> dict[str, Any]:
    """Ray resources of one submission's task: a CPU, and the child's address-space limit plus the grader's share.

    ``memory_mb`` bounds the sandbox child's address space (RLIMIT_AS), so the
    child never uses more; the grader's own process is counted at
    ``GRADER_MEMORY_MB``.  Ray then places no more tasks on a node than its
    memory holds.
    """
    return {"num_cpus": 1, "memory": (rubric.limits.memory_mb + GRADER_MEMORY_MB) << 20}


def grade_remote(bundle: Bundle, rubric: Rubric, plan: Plan, sandbox: str, kit: str, grade_one: GradeOne,
                 discover: Discover) -> Returned:
    """The task, on the worker: refuse if this worker cannot grade as required, else grade the unpacked bundle.

    ``discover`` and ``grade_one`` are the driver's own, so the unpacked copy
    is found and graded exactly as the original is on one machine.
    """
    node = socket.gethostname()
    here = kit_version()
    if here != kit:
        raise WorkerRefused(f"the worker on {node} has pytest-cbatch {here}, the driver {kit}: install the same "
                            f"version on every node")
    try:
        mode, _notice = resolve_mode(sandbox)  # "auto" without bubblewrap: results.json says NOT contained
    except ValueError as exc:
        raise WorkerRefused(f"the worker on {node} cannot grade in the sandbox the run requires: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="cbatch-ray-") as tmp:
        (Path(tmp) / "in").mkdir()
        made = unpack(bundle, Path(tmp) / "in")
        found = discover(Path(tmp) / "in")
        if [s.path for s in found] != [str(made)]:
            raise BundleError(f"bundle {bundle.name}: unpacked, it is found as {[s.name for s in found]}")
        # The bundle's name is already the kit's name for the original (``untrusted.name``), which the
        # unpacked copy's own name would encode once more: the submission keeps the name it has on the driver.
        submission = dataclasses.replace(found[0], name=bundle.name)
        out_dir = Path(tmp) / "out" / submission.name
        result = grade_one(submission, rubric, plan, out_dir, mode)
        files = tuple((p.name, p.read_bytes()) for p in sorted(out_dir.iterdir()) if p.is_file())
    return Returned(result, files)


def grade_on_ray(submissions: Sequence[Submission], rubric: Rubric, plan: Plan, out: Path, sandbox: str,
                 address: str, jobs: int, grade_one: GradeOne, discover: Discover,
                 ) -> Iterator[tuple[str, SubmissionResult | Exception] | None]:
    """Grade on the cluster at ``address`` (``auto``: a local one of ``jobs`` CPUs); yields as ``driver`` expects.

    Yields ``(name, result)`` once per submission as its task finishes (its
    files already written under ``out/name``), ``(name, exception)`` when it
    could not be graded, and None when none finished for ``HEARTBEAT_SECONDS``.
    ValueError when no node can run a task.  Ray's own messages go to stderr.
    """
    ray = import_ray()
    with contextlib.redirect_stdout(sys.stderr):  # Ray prints what it sees go wrong ("a worker died") on stdout
        connect(ray, address, jobs)
        try:
            yield from _graded(ray, submissions, rubric, plan, out, sandbox, grade_one, discover)
        finally:
            ray.shutdown()


def _graded(ray: Any, submissions: Sequence[Submission], rubric: Rubric, plan: Plan, out: Path, sandbox: str,
            grade_one: GradeOne, discover: Discover) -> Iterator[tuple[str, SubmissionResult | Exception] | None]:
    """``grade_on_ray``'s work, once connected."""
    resources = task_resources(rubric)
    check_feasible(ray, resources)
    remote = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=False, **resources)(grade_remote)
    pending: dict[Any, str] = {}
    kit = kit_version()
    for submission in submissions:
        if submission.refused is not None:  # graded 0 without running or reading it: no bytes need travel
            yield submission.name, grade_one(submission, rubric, plan, out / submission.name, sandbox)
            continue
        try:
            bundle = pack(submission)
        except (BundleError, OSError) as exc:
            yield submission.name, exc
            continue
        pending[remote.remote(bundle, rubric, plan, sandbox, kit, grade_one, discover)] = submission.name
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=HEARTBEAT_SECONDS)
        if not ready:
            yield None
            continue
        for ref in ready:
            name = pending.pop(ref)
            try:
                returned = ray.get(ref)
                yield name, place(out / name, name, returned)
            except Exception as exc:  # the task's own error (a refusal), or lost more than MAX_RETRIES times
                yield name, _cause(exc)


def import_ray() -> Any:
    """The ray module; ValueError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ValueError("--ray needs Ray: pip install 'pytest-cbatch[ray]'") from None
    return ray


def connect(ray: Any, address: str, jobs: int) -> None:
    """Join the cluster at ``address``, or with ``auto`` start a local one of ``jobs`` CPUs in this process."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address == "auto":
        ray.init(address="local", num_cpus=max(1, jobs), object_store_memory=LOCAL_OBJECT_STORE,
                 include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)


def check_feasible(ray: Any, resources: dict[str, Any]) -> None:
    """ValueError unless some live node has the CPU and memory one task asks for (else it would wait forever)."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    need_cpu, need_memory = resources["num_cpus"], resources["memory"]
    if not any(r.get("CPU", 0) >= need_cpu and r.get("memory", 0) >= need_memory for r in nodes):
        largest = max((r.get("memory", 0) for r in nodes if r.get("CPU", 0) >= need_cpu), default=0)
        raise ValueError(f"no node of the Ray cluster can run a submission's task: each asks for {need_cpu} CPU and "
                         f"{need_memory >> 20} MiB (the rubric's [limits] memory_mb + {GRADER_MEMORY_MB} MiB for the "
                         f"grader); the largest node with a CPU offers {int(largest) >> 20} MiB")


def place(out_dir: Path, name: str, returned: object) -> SubmissionResult:
    """Check what a task returned for ``name`` and write its files into ``out_dir`` (emptied first)."""
    if not isinstance(returned, Returned) or not isinstance(returned.result, SubmissionResult):
        raise ValueError(f"the task for {name} returned {type(returned).__name__}, not a result")
    if returned.result.name != name:
        raise ValueError(f"the task for {name} returned the result of {returned.result.name!r}")
    files = returned.files
    names = [f[0] if isinstance(f, tuple) and len(f) == 2 else None for f in files]
    if (len(files) > _MAX_RETURNED_FILES or "results.json" not in names or len(set(names)) != len(names)
            or not all(isinstance(n, str) and plain_name(n) for n in names)
            or not all(isinstance(f[1], bytes) for f in files)
            or sum(len(f[1]) for f in files) > MAX_BUNDLE_BYTES):
        raise ValueError(f"the task for {name} returned files that are not a grading output")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    for filename, data in files:
        (out_dir / filename).write_bytes(data)
    return returned.result


def _cause(exc: Exception) -> Exception:
    """The task's own exception out of Ray's wrapper (RayTaskError.cause), so the message names the refusal."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc
