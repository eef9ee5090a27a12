"""The Ray executor (measure/ray_executor.py) on a real local Ray cluster: each job a Ray task running the
local executor on its node; results streamed back in the order they finish; the same plan and the same
order of measurements as the local executor."""
from __future__ import annotations

import pytest

from variantlab.errors import VariantlabError
from variantlab.measure.executor import Task
from variantlab.measure.limits import Limits
from variantlab.measure.ray_executor import check_reachable, is_gpu_job, make_executor, slots, task_resources
from variantlab.measure.wire import MeasureJob, TrackerJob


def job(name: str = "fp32", rnd: int = 0, artifact_dir: str = "/nowhere/at/all") -> MeasureJob:
    return MeasureJob(variant={"name": name}, artifact_dir=artifact_dir, round=rnd, device="cpu", threads=1, seed=0,
                      samples=({"id": "0", "prompt": "p", "answer": "a"},), trackers=(TrackerJob(kind="memory"),),
                      run_once=False)


# ---------------------------------------------------------------- what a task asks for

@pytest.mark.parametrize("device, gpus, expected", [
    ("cuda", 0, True), ("cuda:1", 0, True), ("auto", 2, True), ("auto", 0, False), ("cpu", 8, False)])
def test_a_gpu_job_is_cuda_or_auto_on_a_cluster_with_gpus(device, gpus, expected):
    assert is_gpu_job(device, gpus) is expected


def test_a_gpu_job_takes_one_whole_gpu_and_a_cpu_job_its_threads():
    assert task_resources("cuda", 16, 8, 64) == {"num_gpus": 1, "num_cpus": 1}
    assert task_resources("cpu", 4, 8, 64) == {"num_cpus": 4}
    assert task_resources("auto", 4, 0, 64) == {"num_cpus": 4}
    assert task_resources("cpu", 32, 0, 8) == {"num_cpus": 8}     # never more than the largest node has


def test_slots_count_the_jobs_the_nodes_hold_side_by_side():
    nodes = [{"CPU": 16, "GPU": 2}, {"CPU": 8, "GPU": 1}, {"CPU": 4}]
    assert slots({"num_gpus": 1, "num_cpus": 1}, nodes) == 3        # one measurement a GPU
    assert slots({"num_cpus": 8}, nodes) == 3                        # 2 + 1 + 0
    assert slots({"num_cpus": 64}, nodes) == 1                       # at least one


def test_unknown_executors_and_an_address_without_ray_are_bad_input():
    with pytest.raises(VariantlabError, match="--executor: unknown executor 'rey' \\(accepted: local \\| ray\\)"):
        make_executor("rey")
    with pytest.raises(VariantlabError, match="--address is for the ray executor"):
        make_executor("local", "auto")


def test_an_address_nothing_answers_at_is_refused_at_once():
    with pytest.raises(ConnectionError, match="nothing answers at 127.0.0.1:1"):
        check_reachable("127.0.0.1:1", timeout_s=2)
    check_reachable("auto")      # left to Ray


# ---------------------------------------------------------------- on a real cluster

def test_results_stream_back_and_each_task_is_made_after_a_slot_frees(ray_cluster, tmp_path):
    """A job whose artifact is not on the node fails there, with why, without starting a worker: the stream
    contract (on_start, then on_done per task; tasks pulled only when there is room) on the real cluster."""
    executor = make_executor("ray")
    heard: list[str] = []

    def tasks():
        for r in range(4):
            heard.append(f"made {r}")
            yield Task(f"r{r}", job(rnd=r), tmp_path / f"w{r}")

    executor.run_all(tasks(), Limits(60), lambda t, rec, blobs: heard.append(f"done {t.label} {rec.round}"),
                     on_start=lambda t: heard.append(f"start {t.label}"))
    done = [h for h in heard if h.startswith("done")]
    assert sorted(done) == ["done r0 0", "done r1 1", "done r2 2", "done r3 3"]
    # with 2 CPUs and 1-thread jobs, two run at once: the third is made only after a result came back
    assert heard.index("made 2") > heard.index(done[0])
    assert ray_cluster.is_initialized()       # the executor joined the cluster and leaves it up
    executor.close()
    assert ray_cluster.is_initialized()


def test_a_job_whose_artifact_is_not_on_the_node_fails_with_why(ray_cluster, tmp_path):
    record, blobs = make_executor("ray").run(job(), tmp_path / "w", 60)
    assert (record.status, blobs) == ("failed", {})
    assert record.reason.startswith("artifact folder /nowhere/at/all is not on node ")
    assert "shared filesystem" in record.reason


SLOW_HANDLER = """
import os, signal, sys, time
from variantlab.measure.ray_executor import RayExecutor
def ending(signum, frame):
    time.sleep(4)                      # a shutdown longer than abseil's 3 s abort alarm
    print("ended in our handler", flush=True)
    sys.exit(130)
signal.signal(signal.SIGTERM, ending)
RayExecutor(cpus=1)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
"""


@pytest.mark.slow
def test_a_local_cluster_keeps_our_sigterm_handler_so_a_slow_shutdown_is_not_aborted(tmp_path):
    """Ray's driver puts abseil's failure handler on SIGTERM, whose 3 s alarm aborted a run that took longer
    to end (exit -6 and a core dump instead of 130); RayExecutor puts this process's own handler back."""
    import subprocess
    import sys
    pytest.importorskip("ray")
    proc = subprocess.run([sys.executable, "-c", SLOW_HANDLER], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (130, "ended in our handler"), proc.stderr[-2000:]
