"""Resource checks a run makes before the model loads (docs/security.md, resource limits).

* The population's adapters must fit in memory: ``es.population_size`` members of
  ``layout.numel()`` fp32 numbers, held about twice (members and their noise) while a generation
  is built, must fit in the memory available now (the GPU's when there is one).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from evolm.errors import ConfigError

BYTES_PER_NUMBER = 4  # fp32
COPIES = 2  # members + their noise while ES.sample / ES.tell run


def available_memory() -> tuple[int, str]:
    """``(bytes, where)``: free GPU memory with CUDA, else MemAvailable (Linux) or total RAM."""
    if torch.cuda.is_available():
        return int(torch.cuda.mem_get_info()[0]), "free GPU memory"
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "available RAM"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "RAM"


def population_bytes(numel: int, population_size: int) -> int:
    """Bytes the population's adapters take while a generation is built."""
    return COPIES * BYTES_PER_NUMBER * numel * population_size


def check_population_memory(
    numel: int, population_size: int, available: tuple[int, str] | None = None
) -> None:
    """Refuse a population whose adapters cannot fit in memory (``available``: measured)."""
    need = population_bytes(numel, population_size)
    have, where = available or available_memory()
    if need > have:
        gib = 2**30
        raise ConfigError(
            "es.population_size",
            f"{population_size} members x {numel:,} LoRA numbers need about {need / gib:.1f} GiB "
            f"for the adapters alone, more than the {have / gib:.1f} GiB of {where}",
            "lower es.population_size or lora.rank (or adapt fewer lora.target_modules / "
            "lora.target_layers)",
        )
