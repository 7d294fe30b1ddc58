"""submitit, unchanged from PyPI, against a gpuq cluster through its Slurm
links (sbatch, srun, sacct, scancel, scontrol on PATH). Each check prints
one line; any failure raises, and the process exits non-zero."""

import os
import sys
import time
from pathlib import Path

import submitit
from submitit.slurm import slurm

FOLDER = Path(sys.argv[1])
# Ask sacct every second rather than every ten minutes.
slurm.SlurmJob.watcher = slurm.SlurmInfoWatcher(delay_s=1)


def executor(**params):
    ex = submitit.SlurmExecutor(folder=FOLDER / "%j")
    ex.update_parameters(time=5, signal_delay_s=30, **params)
    return ex


def add(a, b):
    return a + b


def where():
    env = submitit.JobEnvironment()
    return (
        env.global_rank,
        env.local_rank,
        env.node,
        env.num_tasks,
        env.num_nodes,
        os.environ["CUDA_VISIBLE_DEVICES"],
    )


def fail():
    raise ValueError("this function fails on purpose")


def sleep_long():
    time.sleep(600)


class Counter(submitit.helpers.Checkpointable):
    """Runs until interrupted; after its requeue, returns what it saw."""

    def __init__(self):
        self.started = 0

    def __call__(self, flag):
        self.started += 1
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        if restarts == 0:
            Path(flag).write_text("running")
            while True:
                time.sleep(0.1)
        return (self.started, restarts, os.environ["SLURM_JOB_ID"])


def wait_state(job, want, timeout=60):
    start = time.time()
    while time.time() - start < timeout:
        state = job.watcher.get_state(job.job_id, mode="force")
        if state.startswith(want):
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job.job_id} never reached {want}: {state}")


def main():
    job = executor().submit(add, 2, 3)
    assert job.result() == 5, job.result()
    print("result: ok", job.job_id)

    job = executor(nodes=2, ntasks_per_node=2, gpus_per_node=2).submit(where)
    ranks = sorted(job.results())
    assert [r[0] for r in ranks] == [0, 1, 2, 3], ranks
    assert [r[1] for r in ranks] == [0, 1, 0, 1], ranks
    assert [r[2] for r in ranks] == [0, 0, 1, 1], ranks
    assert all(r[3] == 4 and r[4] == 2 for r in ranks), ranks
    assert all(r[5] == "0,1" for r in ranks), ranks
    print("2 nodes x 2 tasks: ok", ranks)

    jobs = executor().map_array(add, [1, 2, 3], [10, 20, 30])
    assert [j.result() for j in jobs] == [11, 22, 33]
    assert all("_" in j.job_id for j in jobs), [j.job_id for j in jobs]
    print("map_array: ok", [j.job_id for j in jobs])

    job = executor().submit(fail)
    err = job.exception()
    assert err is not None and "fails on purpose" in str(err), err
    print("traceback: ok")

    job = executor().submit(sleep_long)
    wait_state(job, "RUNNING")
    job.cancel()
    state = wait_state(job, "CANCELLED")
    print("cancel: ok", state)

    requeue_check()


def requeue_check():
    flag = FOLDER / "counter.flag"
    job = executor().submit(Counter(), str(flag))
    while not flag.exists():
        time.sleep(0.1)
    job._interrupt(timeout=True)
    started, restarts, job_id = job.result()
    assert restarts == 1 and job_id == job.job_id, (started, restarts, job_id)
    print("timeout -> checkpoint -> requeue -> same id resumes: ok", job_id, restarts)


if __name__ == "__main__":
    main()
