"""One ES run over several processes (GPUs, nodes): the only module that calls torch.distributed.

Launched by ``torchrun`` (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR/PORT``) or by
SLURM with one task per GPU (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``; the master is
the first host of ``SLURM_JOB_NODELIST``), :func:`setup` joins the process group (NCCL on GPUs,
gloo on CPU; ``EVOLM_DIST_BACKEND`` overrides) and puts rank ``r`` on ``cuda:LOCAL_RANK``.

Every rank runs the whole loop: it rebuilds the same population from the seeds, generates and
scores ITS rows of the (member, prompt) grid (rows ``rank, rank + world, ...``: interleaved, so
ranks finish together), and one all-gather gives every rank every row's scores, so every rank
computes the same fitness and applies the same ES update. :meth:`Comm.check_same` compares a
checksum of the mean across ranks after each update. Only rank 0 writes anything.

A single process gets :data:`SINGLE`, whose collectives are identities: the loop has one path.
"""

from __future__ import annotations

import datetime as _dt
import gc
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)

T = TypeVar("T")
CLOSE_TIMEOUT_S = 60.0  # how long a finished rank waits for the others before leaving


class DivergenceError(RuntimeError):
    """Ranks hold different ES means: their updates were not identical."""


@dataclass(frozen=True)
class Launch:
    """Where this process sits in the job, read from the launcher's environment."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    source: str = "single"  # "torchrun", "slurm" or "single"


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``gpu[03-05,07],cpu1`` -> ``gpu03``."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if m is None:
        raise ValueError(f"cannot read the SLURM node list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def launch_env(env: Mapping[str, str] | None = None) -> Launch:
    """The job layout from ``torchrun``'s variables, else SLURM's (more than one task), else a
    single process."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return Launch(
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=int(env["WORLD_SIZE"]),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", "29500")),
            source="torchrun",
        )
    if int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env:
        job = int(env.get("SLURM_JOB_ID", "0"))
        nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "127.0.0.1"
        return Launch(
            rank=int(env["SLURM_PROCID"]),
            local_rank=int(env.get("SLURM_LOCALID", "0")),
            world_size=int(env["SLURM_NTASKS"]),
            master_addr=env.get("MASTER_ADDR") or first_host(nodes),
            master_port=int(env.get("MASTER_PORT") or 20000 + job % 20000),
            source="slurm",
        )
    return Launch()


class Comm:
    """The collectives the loop needs. This base class is one process (every call an
    identity); :class:`TorchComm` is a torch.distributed process group."""

    rank = 0
    local_rank = 0
    world_size = 1
    start_time = time.time()  # the run's clock (${evolm.now:...}): rank 0's in a group

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes checkpoints, logs, plots and the adapter."""
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """This rank's device: ``cuda:LOCAL_RANK`` with GPUs (``cuda`` alone), else CPU."""
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's share of ``items``: every ``world_size``-th one from ``rank``."""
        return list(items[self.rank :: self.world_size])

    def unshard(self, parts: Sequence[Sequence[T]]) -> list[T]:
        """Inverse of :meth:`shard`: the per-rank lists interleaved back into one."""
        total = sum(len(p) for p in parts)
        out: list[Any] = [None] * total
        for r, part in enumerate(parts):
            out[r :: len(parts)] = list(part)
        return out

    def gather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` (picklable), indexed by rank, on every rank."""
        return [obj]

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every rank."""
        return obj

    def check_same(self, tensors: Sequence[torch.Tensor], what: str) -> None:
        """Raise :class:`DivergenceError` unless every rank holds bitwise-equal ``tensors``."""

    def barrier(self) -> None: ...

    def close(self, finished: bool = False) -> None: ...


SINGLE = Comm()


def checksum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Two int64s that any change of a bit, or a swap of elements, in ``tensors`` changes
    (with overwhelming probability): the sum of their 32-bit words, and that sum weighted by
    position. One pass, computed where the tensors are."""
    words = [t.detach().float().contiguous().view(-1).view(torch.int32).long() for t in tensors]
    flat = torch.cat(words) if words else torch.zeros(0, dtype=torch.int64)
    weight = torch.arange(flat.numel(), device=flat.device, dtype=torch.int64) % 65_521 + 1
    return torch.stack([flat.sum(), (flat * weight).sum()])


class TorchComm(Comm):
    """A joined torch.distributed process group (see :func:`setup`)."""

    def __init__(self, launch: Launch, backend: str) -> None:
        import torch.distributed as dist

        self.dist, self.backend = dist, backend
        self.rank, self.local_rank = launch.rank, launch.local_rank
        self.world_size = launch.world_size
        self.gather_s = 0.0  # seconds spent in gather() so far (benchmarks, records)
        stamp = [time.time()]
        dist.broadcast_object_list(stamp, src=0)
        self.start_time = float(stamp[0])

    @property
    def device(self) -> torch.device:
        if self.backend == "nccl" or torch.cuda.is_available():
            return torch.device("cuda", self.local_rank % max(1, torch.cuda.device_count()))
        return torch.device("cpu")

    def gather(self, obj: T) -> list[T]:
        start = time.perf_counter()
        out: list[Any] = [None] * self.world_size
        self.dist.all_gather_object(out, obj)
        self.gather_s += time.perf_counter() - start
        return out

    def broadcast(self, obj: T) -> T:
        box: list[Any] = [obj if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]  # type: ignore[no-any-return]

    def check_same(self, tensors: Sequence[torch.Tensor], what: str) -> None:
        local = checksum(tensors).to(self.comm_device)
        every = [torch.empty_like(local) for _ in range(self.world_size)]
        self.dist.all_gather(every, local)
        sums = [tuple(int(v) for v in s.tolist()) for s in every]
        differ = [r for r, s in enumerate(sums) if s != sums[0]]
        if differ:
            raise DivergenceError(
                f"{what} differs across ranks (ranks {differ} vs rank 0; checksums {sums}): every "
                "rank must draw the same noise and apply the same update. Run all ranks on the "
                "same kind of device and the same software versions (CUDA and CPU noise differ)"
            )

    @property
    def comm_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def barrier(self) -> None:
        self.dist.barrier()

    def close(self, finished: bool = False) -> None:
        """Leave the group. A rank that ``finished`` its run first waits (at most
        :data:`CLOSE_TIMEOUT_S`, gloo) until every rank has, so no rank tears its links down
        while a peer may still use them; then the group is destroyed and its C++ objects freed
        while the interpreter is whole (a gloo group left to interpreter shutdown can abort the
        process: ``terminate called without an active exception``, SIGABRT)."""
        if not self.dist.is_initialized():
            return
        if finished and self.backend == "gloo":
            try:
                self.dist.monitored_barrier(timeout=_dt.timedelta(seconds=CLOSE_TIMEOUT_S))
            except RuntimeError as e:  # a rank that failed after its last collective
                log.warning("rank %d: not every rank reached the end (%s)", self.rank, e)
        self.dist.destroy_process_group()
        gc.collect()


_CURRENT: Comm = SINGLE


def setup(env: Mapping[str, str] | None = None, timeout_s: float = 1800.0) -> Comm:
    """Join the job's process group when launched with more than one process (torchrun,
    SLURM), set this rank's CUDA device, and make the result :func:`current`."""
    global _CURRENT
    launch = launch_env(env)
    if launch.world_size <= 1:
        _CURRENT = SINGLE
        return SINGLE
    import torch.distributed as dist

    env = os.environ if env is None else env
    backend = env.get("EVOLM_DIST_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(launch.local_rank % torch.cuda.device_count())
    if launch.source == "slurm":  # torchrun sets these itself
        os.environ.setdefault("MASTER_ADDR", launch.master_addr)
        os.environ.setdefault("MASTER_PORT", str(launch.master_port))
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=_dt.timedelta(seconds=timeout_s),
    )
    _CURRENT = TorchComm(launch, backend)
    log.info(
        "rank %d of %d (%s, %s backend, device %s)",
        launch.rank,
        launch.world_size,
        launch.source,
        backend,
        _CURRENT.device,
    )
    return _CURRENT


def current() -> Comm:
    """The process group :func:`setup` joined (:data:`SINGLE` before, or for one process)."""
    return _CURRENT


def teardown(finished: bool = False) -> None:
    """Leave the process group at the end of the process; ``finished``: this rank's run ended
    normally (:meth:`TorchComm.close`)."""
    global _CURRENT
    comm, _CURRENT = _CURRENT, SINGLE
    comm.close(finished)
