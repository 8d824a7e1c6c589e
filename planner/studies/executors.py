"""Where the tasks of a what-if grid run: in this process, in local processes, or on a Dask cluster.

`run_tasks(function, tasks, executor, ...)` calls `function(task)` for every task and yields
`(index, result)` as tasks finish, or `(index, TaskFailure)` when a task could not run to the end
(an exception, a worker that died): a failure never loses the task, the caller reports it.

* `local`: in this process (`workers` = 1) or in `workers` local processes.
* `dask`: on a `dask.distributed` cluster: the scheduler at `address` (`tcp://host:8786`), or a
  LocalCluster of `workers` processes started for the run. Why Dask rather than Ray
  (docs/capacity.md): it is plain Python, installs from PyPI without a native runtime, a
  LocalCluster of processes runs the same code a multi-machine cluster does (tests use one), and
  its futures report a task's exception or a lost worker per task.
* `ray`: not provided; the error names the alternative.
"""

from __future__ import annotations

import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from scepsy.models.errors import InputError

EXECUTORS = ("local", "dask", "ray")


@dataclass(frozen=True)
class TaskFailure:
    """A task that did not finish: the error's type and message (one line)."""

    kind: str
    message: str

    @property
    def reason(self) -> str:
        return f"{self.kind}: {self.message}".splitlines()[0]


def check_executor(executor: str, address: str | None) -> None:
    if executor not in EXECUTORS:
        raise InputError(None, "executor", f"unknown executor {executor!r}", f"use one of: {', '.join(EXECUTORS)}")
    if executor == "ray":
        raise InputError(None, "executor", "the ray executor is not provided (docs/capacity.md says why)",
                         "use `executor` dask (with `address` tcp://SCHEDULER:8786 for a cluster) or local")
    if address is not None and executor != "dask":
        raise InputError(None, "address", "an address needs `executor` dask", "set `executor` to dask")


def run_tasks(
    function: Callable[[Any], Any], tasks: Sequence[Any], executor: str = "local", workers: int = 1,
    address: str | None = None,
) -> Iterator[tuple[int, Any]]:
    check_executor(executor, address)
    if executor == "dask":
        yield from _dask(function, tasks, workers, address)
    elif workers <= 1:
        for index, task in enumerate(tasks):
            yield index, _guarded(function, task)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_guarded, function, task): index for index, task in enumerate(tasks)}
            for future in as_completed(futures):
                yield futures[future], _result_or_failure(future)


def _guarded(function, task):
    """Run one task; an exception becomes a TaskFailure (a bug in one scenario loses no other)."""
    try:
        return function(task)
    except Exception as error:  # noqa: BLE001 - reported per scenario, with its type and message
        traceback.print_exc()
        return TaskFailure(type(error).__name__, str(error))


def _result_or_failure(future):
    try:
        return future.result()
    except Exception as error:  # noqa: BLE001 - a worker process that died
        return TaskFailure(type(error).__name__, str(error) or "the worker process stopped")


def _dask(function, tasks, workers: int, address: str | None):
    from dask.distributed import Client, LocalCluster, as_completed as dask_completed

    cluster = None
    if address is None:
        # None: no dashboard, as distributed's LocalCluster docstring says; pyright infers str from the
        # unannotated parameter's default ":8787"
        cluster = LocalCluster(n_workers=max(workers, 1), threads_per_worker=1, processes=True, dashboard_address=None)  # pyright: ignore[reportArgumentType]
    try:
        with Client(address or cluster) as client:
            futures = client.map(_guarded, [function] * len(tasks), tasks, pure=False, retries=0)
            index = {future.key: k for k, future in enumerate(futures)}
            for future in dask_completed(futures):
                yield index[future.key], _result_or_failure(future)
    finally:
        if cluster is not None:
            cluster.close()
