"""The Dask executor against a real dask.distributed LocalCluster of several worker processes:
the table is byte-identical to the local executor's, and a task whose worker dies is reported,
not lost (https://distributed.dask.org/en/stable/api.html#distributed.LocalCluster)."""

from __future__ import annotations

import os

import pytest

from scepsy.models.instance.instance import load_instance
from scepsy.planner.studies.executors import TaskFailure, run_tasks
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.studies.whatif import Axes, run_study, write_table

from conftest import INSTANCES

distributed = pytest.importorskip("dask.distributed")


@pytest.fixture(scope="module")
def cluster():
    import dask.config

    # a task whose worker dies is not retried on another worker (the default retries 3 times)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as local:
            yield local


@pytest.mark.slow
def test_dask_table_is_byte_identical_to_local(cluster, tmp_path, monkeypatch):
    import scepsy.planner.studies.whatif as whatif

    monkeypatch.setattr(whatif, "CHUNK_POINTS", 2)  # several tasks, so both workers take some
    instance = load_instance(INSTANCES / "combined-8xh100.yaml")
    axes = Axes(workflow_rates={"beam": [2.0], "rag": [2.0, 10.0, 20.0, 30.0]}, clusters=[16, 64])
    seen = []
    remote = run_study(instance, axes, PlanSettings(), executor="dask", address=cluster.scheduler_address,
                       progress=lambda done, total: seen.append((done, total)))
    local = run_study(instance, axes, PlanSettings())
    write_table(remote, tmp_path / "dask.csv")
    write_table(local, tmp_path / "local.csv")
    assert (tmp_path / "dask.csv").read_bytes() == (tmp_path / "local.csv").read_bytes()
    assert remote.feasible.all()
    assert seen[-1] == (8, 8) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    with distributed.Client(cluster.scheduler_address) as client:
        assert len(client.scheduler_info()["workers"]) == 2


def test_a_task_whose_worker_dies_is_reported(cluster):
    """os._exit stops the worker process mid-task: that task comes back as a TaskFailure, the
    others with their results."""
    results = dict(run_tasks(os._exit, [3], "dask", address=cluster.scheduler_address))
    assert isinstance(results[0], TaskFailure) and results[0].reason
    results = dict(run_tasks(abs, [-1, -2, -3], "dask", address=cluster.scheduler_address))
    assert results == {0: 1, 1: 2, 2: 3}


def test_a_task_that_raises_is_reported_with_its_error(cluster):
    results = dict(run_tasks(int, ["7", "seven"], "dask", address=cluster.scheduler_address))
    assert results[0] == 7
    assert isinstance(results[1], TaskFailure) and results[1].kind == "ValueError" and "seven" in results[1].reason
