"""Distributed ES (evolm.dist): launch environments, the gloo collectives in real processes, and
``torchrun`` runs that must equal one process bit for bit (fresh, multi-node rendezvous, resume
at another world size)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from evolm import dist
from evolm.dist import SINGLE, DivergenceError, checksum, first_host, launch_env
from evolm.engine.base import Completion, Engine, TextRequest
from evolm.evaluate import evaluate, evaluate_with_extra
from evolm.lora.layout import LoraLayout, LoraPopulation, LoraTarget
from evolm.sampling import Sampling
from evolm.server.connection import free_port
from evolm.task.base import Example, Scores, Task
from tests.helpers import REPO, gloo_env, read_results


# -- launch environments -------------------------------------------------------------------
def test_launch_env_reads_torchrun_then_slurm() -> None:
    assert launch_env({}) == dist.Launch()
    run = launch_env(
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "n0", "MASTER_PORT": "7"}
    )
    assert (run.rank, run.local_rank, run.world_size, run.master_addr, run.source) == (
        3,
        1,
        4,
        "n0",
        "torchrun",
    )
    slurm = launch_env(
        {
            "SLURM_PROCID": "5",
            "SLURM_LOCALID": "1",
            "SLURM_NTASKS": "8",
            "SLURM_JOB_NODELIST": "gpu[07-10],cpu1",
            "SLURM_JOB_ID": "123456",
        }
    )
    assert (slurm.rank, slurm.local_rank, slurm.world_size, slurm.source) == (5, 1, 8, "slurm")
    assert (slurm.master_addr, slurm.master_port) == ("gpu07", 20000 + 123456 % 20000)
    # one SLURM task (a plain sbatch job) is one process
    assert launch_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).world_size == 1


def test_first_host() -> None:
    assert first_host("node1") == "node1"
    assert first_host("a[3,5-6]") == "a3"
    assert first_host("gpu-[012-015],b2") == "gpu-012"


def test_shard_and_unshard_interleave_rows() -> None:
    class Two(dist.Comm):
        world_size = 3

    rows = list(range(10))
    parts = []
    for r in range(3):
        c = Two()
        c.rank = r
        parts.append(c.shard(rows))
    assert parts == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]  # sizes differ by one at most
    assert Two().unshard(parts) == rows


def test_checksum_sees_one_bit_and_a_swap() -> None:
    x = [torch.randn(5, 3), torch.randn(4)]
    base = checksum(x)
    flipped = [x[0].clone(), x[1]]
    flipped[0].view(-1).view(torch.int32)[7] ^= 1  # the last bit of one element
    assert not torch.equal(checksum(flipped), base)
    swapped = [x[0].clone(), x[1]]
    swapped[0][0, 0], swapped[0][1, 0] = x[0][1, 0].item(), x[0][0, 0].item()
    assert not torch.equal(checksum(swapped), base)
    assert torch.equal(checksum([t.clone() for t in x]), base)


def test_only_evolm_dist_touches_torch_distributed() -> None:
    """The collectives live in evolm/dist.py; the ES core (and everything else) has none."""
    pattern = re.compile(r"torch\.distributed|from torch import .*distributed")
    users = {
        str(p.relative_to(REPO))
        for p in (REPO / "evolm").rglob("*.py")
        if pattern.search(p.read_text(encoding="utf-8"))
    }
    assert users == {"evolm/dist.py"}


# -- collectives in real processes (gloo) ------------------------------------------------------
LAYOUT = LoraLayout(targets=(LoraTarget(0, "q_proj", 2, 2),), rank=1, alpha=1.0, num_layers=1)


class LabelEngine(Engine):
    """Completion = prompt + the member's label (its first LoRA value): no model needed."""

    layout = LAYOUT

    def format_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        return messages[-1]["content"]

    def generate_rows(self, request: TextRequest) -> list[str]:
        prompts, adapters = request.prompts, request.adapters
        labels = [0] if adapters is None else [int(t.flatten()[0]) for t in adapters.tensors[0]]
        return [
            Completion(f"{prompts[p]}{'!' * labels[m]}", tokens=labels[m], truncated=labels[m] > 2)
            for m, p in request.rows
        ]

    def close(self) -> None: ...


class LengthTask(Task):
    """reward = length of the completion; ``batch`` also counts the batch's duplicates (a reward
    that depends on the other rows: only right when the whole population is scored at once)."""

    sampling = Sampling(max_new_tokens=4)

    def __init__(self, row_scores: bool) -> None:
        self.row_scores = row_scores

    def train_examples(self, generation: int) -> list[Example]:
        return [Example(prompt=p) for p in ("a", "bb", "ccc")]

    def eval_examples(self) -> list[Example]:
        return [Example(prompt="z")]

    def score(self, examples: Sequence[Example], completions: Sequence[str]) -> Scores:
        rewards = [float(len(c)) for c in completions]
        if not self.row_scores:
            rewards = [r + completions.count(c) for r, c in zip(rewards, completions, strict=True)]
        return {
            "reward": rewards,
            "length": [float(len(c)) for c in completions],
            "_exclaimed": [float(c.endswith("!")) for c in completions],  # summarize's alone
        }

    def summarize(self, examples: Sequence[Example], scores: Scores) -> dict[str, float]:
        """Set-level numbers need every rank's rows: how many rows, and how many exclaim."""
        return {"rows": float(len(examples)), "exclaimed": sum(scores["_exclaimed"])}


def population(members: int) -> LoraPopulation:
    a = torch.arange(members, dtype=torch.float32).view(members, 1, 1).expand(members, 1, 2)
    return LoraPopulation(LAYOUT, (a.contiguous(), torch.zeros(members, 2, 1)))


def _worker(rank: int, world: int, port: int) -> None:
    env = gloo_env(rank, world, port)
    os.environ.update(env)
    comm = dist.setup(env, timeout_s=60)
    try:
        assert (comm.rank, comm.world_size) == (rank, world)
        assert comm.gather(rank * 10) == [r * 10 for r in range(world)]
        assert comm.broadcast(f"from {rank}") == "from 0"
        engine = LabelEngine()
        pop = population(5)  # 15 rows: 8 on rank 0, 7 on rank 1
        for row_scores in (True, False):
            task = LengthTask(row_scores)
            examples = task.train_examples(1)
            alone = evaluate(engine, task, examples, pop, seed=0, comm=SINGLE)
            shared = evaluate(engine, task, examples, pop, seed=0, comm=comm)
            assert torch.equal(shared.fitness, alone.fitness), (row_scores, shared.fitness)
            assert shared.metrics == alone.metrics
            # the diagnostics see every row's completion, tokens and truncation
            assert shared.diagnostics == alone.diagnostics
            assert set(alone.diagnostics) >= {"truncated_share", "completion_tokens"}
            # the task's summarize sees every rank's rows; "_" keys are not metrics
            assert alone.diagnostics["rows"] == 15 and alone.diagnostics["exclaimed"] == 12
            assert "_exclaimed" not in alone.metrics and "_exclaimed" not in shared.scores
            mine = comm.shard([(m, p) for m in range(5) for p in range(3)])
            assert all(shared.completions[m][p] == alone.completions[m][p] for m, p in mine)
            # one row for two ranks: rank 1 has none
            one = evaluate(engine, task, task.eval_examples(), None, seed=0, comm=comm)
            assert one.metrics == {"reward": 1.0 + (not row_scores), "length": 1.0}
            assert one.diagnostics["rows"] == 1
        comm.check_same([torch.ones(3), torch.arange(4.0)], "same")
        with pytest.raises(DivergenceError, match="differs across ranks"):
            comm.check_same([torch.ones(3) * (1 + rank * 1e-7)], "the ES mean")
    finally:
        dist.teardown()


def test_gloo_ranks_evaluate_like_one_process() -> None:
    """Two gloo processes: sharded evaluation equals one process's (per-row scores, and the
    whole-population scoring of a task with ``row_scores=False``); a rank with no rows; a
    mean that differs by one rounding step raises DivergenceError on every rank."""
    mp.spawn(_worker, args=(2, free_port()), nprocs=2, join=True)


def _split_worker(rank: int, world: int, port: int) -> None:
    os.environ.update(gloo_env(rank, world, port))
    comm = dist.setup(timeout_s=60)
    try:
        engine, examples = LabelEngine(), LengthTask(True).train_examples(1)
        # 15 rows over 2 ranks; the extra answers as member 1 (a reward counting duplicates
        # across rows would change member 1's if the parts were scored together)
        members, extra = population(4), population(4).subset([1])
        for row_scores in (True, False):
            task = LengthTask(row_scores)
            one = evaluate_with_extra(engine, task, examples, members, extra, 0, SINGLE)
            shared = evaluate_with_extra(engine, task, examples, members, extra, 0, comm)
            alone = (
                evaluate(engine, task, examples, members, seed=0, comm=comm),
                evaluate(engine, task, examples, extra, seed=0),
            )
            for got, want in ((shared, one), (shared, alone)):
                for part, same in zip(got, want, strict=True):
                    assert torch.equal(part.fitness, same.fitness), (row_scores, part.fitness)
                    assert part.metrics == same.metrics, (row_scores, part.metrics)
                    assert part.diagnostics == same.diagnostics and part.scores == same.scores
            # the members' rows are on the ranks they have without the extra adapter
            mine = comm.shard([(m, p) for m in range(4) for p in range(3)])
            assert all(shared[0].completions[m][p] == one[0].completions[m][p] for m, p in mine)
            assert shared[1].diagnostics["rows"] == 3 and shared[0].diagnostics["rows"] == 12
    finally:
        dist.teardown()


def test_gloo_ranks_split_the_extra_adapter_like_one_process() -> None:
    """``train_mean``'s evaluation in two gloo processes: the members' part and the extra
    adapter's equal one process's, and each equals its own evaluation alone (row_scores=False
    too: each part is scored by its own call on rank 0)."""
    mp.spawn(_split_worker, args=(2, free_port()), nprocs=2, join=True)


def _closing_worker(rank: int, port: int, out: str) -> None:
    """Rank 1 reaches its end 1 s after rank 0; then (round 2) rank 1 fails before the end."""
    import time

    env = gloo_env(rank, 2, port)  # MASTER_PORT set per round below
    waited = []
    for round_, finished in ((0, True), (1, rank == 0)):
        os.environ.update({**env, "MASTER_PORT": str(port + round_)})
        dist.setup(timeout_s=60)
        dist.CLOSE_TIMEOUT_S = 1.0
        if rank == 1:
            time.sleep(1.0)
        start = time.monotonic()
        dist.teardown(finished)
        waited.append(time.monotonic() - start)
        assert not torch.distributed.is_initialized() and dist.current() is SINGLE
    if rank == 0:
        Path(out).write_text(json.dumps(waited))


def test_a_finished_rank_leaves_the_group_with_the_others() -> None:
    """Before: a rank left (destroyed its gloo group and exited) while its peer could still be
    running; 1 in 6 finished 2-rank runs aborted at exit (``terminate called without an active
    exception``). Now a finished rank waits for every rank (bounded), then frees the group."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"evolm-closing-{os.getpid()}.json"
    port = free_port()
    try:
        mp.spawn(_closing_worker, args=(port, str(out)), nprocs=2, join=True)
        together, peer_failed = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    assert 0.8 < together < 5  # waited for rank 1's end
    assert peer_failed < 5  # a peer that never arrives costs CLOSE_TIMEOUT_S, not the run's


@pytest.mark.slow
def test_finished_two_rank_runs_exit_0_on_every_rank(tmp_path: Path) -> None:
    """Four finished 2-rank runs (torchrun, gloo, MLflow logger): every rank exits 0, none
    aborts at exit."""
    for i in range(4):
        run_dir = tmp_path / f"run{i}"
        port = f"--master_port={free_port()}"
        cmd = torchrun("--nproc_per_node=2", "--master_addr=127.0.0.1", port)
        proc = subprocess.run(
            [*cmd, "debug=fast", f"hydra.run.dir={run_dir}"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**_env(), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
            cwd=REPO,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        assert "terminate called" not in out and "exitcode" not in out, out[-4000:]
        assert (run_dir / ADAPTER).is_file()


# -- torchrun, end to end ----------------------------------------------------------------------
RUN = [
    "debug=fast",
    "logger=none",
    "callbacks.checkpoint.every=1",
    "callbacks.plot.min_interval_s=60",
]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TQDM_DISABLE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }


def _run(cmd: list[str], timeout: float = 300) -> None:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=REPO
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args, "-m", "evolm"]


def _nodes(port: int, node: int) -> list[str]:
    """One of two "nodes" (torchrun agents) of one process each, c10d rendezvous."""
    return torchrun(
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=evolm-test",
        f"--node-rank={node}",
        "--local-addr=127.0.0.1",
    )


KL_KEYS = ("eval/kl_mean", "eval/kl_std")


def _records(run_dir: Path) -> list[dict[str, object]]:
    """The records but their times and the KL (:func:`_kl`): equal to the bit at any world size."""
    return [
        {k: v for k, v in r.items() if not k.startswith("time/") and k not in KL_KEYS}
        for r in read_results(run_dir)
    ]


def _kl(run_dir: Path) -> list[float]:
    """The KL of every eval. Each rank scores its share of the eval rows in its own batches, and
    a batch's padding moves the forward's float rounding: equal to ~1e-7, not to the bit."""
    return [float(r[k]) for r in read_results(run_dir) for k in KL_KEYS if k in r]


ADAPTER = Path("adapter") / "adapter_model.safetensors"


@pytest.mark.slow
def test_torchrun_equals_one_process_and_resumes_at_any_world_size(tmp_path: Path) -> None:
    """``torchrun --nproc_per_node=2 -m evolm debug=fast`` (gloo) writes the final adapter of
    ``python -m evolm debug=fast`` byte for byte, and the same records; a one-process run's
    checkpoint resumed by two "nodes" (c10d rendezvous on 127.0.0.1) ends on the same bytes,
    and so does a run of two SLURM tasks (srun's environment)."""
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, "-m", "evolm", *RUN, f"hydra.run.dir={one}"])
    port = free_port()
    _run(
        [
            *torchrun("--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={port}"),
            *RUN,
            f"hydra.run.dir={two}",
        ]
    )
    assert (two / ADAPTER).read_bytes() == (one / ADAPTER).read_bytes()
    assert _records(two) == _records(one)
    assert _kl(two) == pytest.approx(_kl(one), rel=1e-5) and _kl(one)
    trained = [r for r in read_results(two) if r["generation"] > 0]
    assert all(0 < r["time/comm_s"] < r["time/generation_s"] for r in trained)
    assert all("time/comm_s" not in r for r in read_results(one))
    assert sorted(p.name for p in two.glob("rank*.log")) == ["rank1.log"]  # rank 1 writes no more
    assert not (two / ".hydra" / "rank1").exists()

    # resume generation 3 of the one-process run on 2 "nodes" x 1 process
    resumed = tmp_path / "resumed"
    shutil.copytree(one, resumed)
    shutil.rmtree(resumed / "adapter")
    for stale in (resumed / "checkpoints").glob("gen-000003.pt*"):
        stale.unlink()
    port = free_port()
    agents = [
        subprocess.Popen(
            [*_nodes(port, node), f"resume={resumed}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(),
            cwd=REPO,
        )
        for node in (0, 1)
    ]
    outs = [a.communicate(timeout=300)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert (resumed / ADAPTER).read_bytes() == (one / ADAPTER).read_bytes()
    assert _records(resumed) == _records(one)
    assert "resuming" in outs[0]

    # 2 SLURM tasks (srun's environment, as launchers/slurm_train.sh sets it): plain python
    slurm, port = tmp_path / "slurm", free_port()
    tasks = [
        subprocess.Popen(
            [sys.executable, "-m", "evolm", *RUN, f"hydra.run.dir={slurm}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env={
                **_env(),
                "SLURM_PROCID": str(task),
                "SLURM_LOCALID": "0",
                "SLURM_NTASKS": "2",
                "SLURM_JOB_ID": "77",
                "SLURM_JOB_NODELIST": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
        )
        for task in (0, 1)
    ]
    outs = [t.communicate(timeout=300)[0] for t in tasks]
    assert [t.returncode for t in tasks] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert (slurm / ADAPTER).read_bytes() == (one / ADAPTER).read_bytes()


def test_multirun_under_torchrun_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "evolm", "-m", "hparams_search=es_optuna"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**_env(), "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
    )
    assert proc.returncode == 2
    assert "sweep_workers.sh" in proc.stderr
    assert not (tmp_path / "outputs").exists()


# -- the benchmark -----------------------------------------------------------------------------
BENCH = ["--members", "4", "--prompts", "3", "--prompt-len", "8", "--new-tokens", "4"]


def _bench_worker(rank: int, port: int, out: str) -> None:
    from benchmarks import distributed

    os.environ.update(gloo_env(rank, 2, port))
    distributed.main([*BENCH, "--reps", "1", "--json", out, "--markdown", out + ".md"])


@pytest.mark.slow
def test_distributed_benchmark_on_two_gloo_ranks(tmp_path: Path) -> None:
    """``torchrun --nproc_per_node=2 -m benchmarks.distributed`` on CPU: per-rank timings of
    both ranks, the all-gather cost, the measured speedup and the 2/4/8 projection."""
    out = tmp_path / "bench.json"
    mp.spawn(_bench_worker, args=(free_port(), str(out)), nprocs=2, join=True)
    result = json.loads(out.read_text())
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    summary = result["summary"]
    assert summary["world_size"] == 2 and summary["alone_s"] > 0
    # the all-gather is timed minus a barrier's cost: a few microseconds, 0 within CPU noise
    assert summary["gather_s"] >= 0
    assert summary["measured_speedup"] == summary["alone_s"] / summary["generation_s"]
    assert set(summary["projected"]) == {"2", "4", "8"}
    for projected in summary["projected"].values():
        assert projected["speedup"] > 0 and 0 <= projected["comm_fraction"] < 1
    assert "| 8 |" in (tmp_path / "bench.json.md").read_text()


# -- sweeps on K GPUs ----------------------------------------------------------------------------
@pytest.mark.slow
def test_sweep_workers_one_per_gpu_share_one_study(tmp_path: Path) -> None:
    """``GPUS=0,1 launchers/sweep_workers.sh 2 1``: two workers, each pinned to its own GPU
    (``CUDA_VISIBLE_DEVICES``), add their trials to ONE sqlite study."""
    import optuna

    proc = subprocess.run(
        [
            "bash",
            str(REPO / "launchers" / "sweep_workers.sh"),
            "2",
            "1",
            f"hydra.sweeper.storage=sqlite:///{tmp_path}/optuna.db",
            "hydra.sweeper.study_name=gpus",
            "generations=1",
            "es.population_size=2",
            "task.max_new_tokens=4",
            "logger=none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**_env(), "GPUS": "0,1", "ROOT": str(tmp_path / "sweep"), "PYTHON": sys.executable},
    )
    outs = [(tmp_path / "sweep" / f"worker{i}.out").read_text() for i in (0, 1)]
    assert proc.returncode == 0, proc.stderr + "\n".join(o[-2000:] for o in outs)
    assert [o.splitlines()[0] for o in outs] == [
        "worker 0: CUDA_VISIBLE_DEVICES=0",
        "worker 1: CUDA_VISIBLE_DEVICES=1",
    ]
    trials = optuna.load_study(study_name="gpus", storage=f"sqlite:///{tmp_path}/optuna.db").trials
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE"]
    assert trials[0].params != trials[1].params
