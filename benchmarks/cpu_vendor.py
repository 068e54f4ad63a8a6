"""Which CPU ops round by the CPU's vendor under the tiny model's build pins (session 32).

``python -m benchmarks.cpu_vendor`` prints, under ``evolm.model.tiny.pinned``'s environment
(ATen's AVX2 kernels, MKL's ``COMPATIBLE,STRICT`` branch, one thread), the sha256 of what
torch returns for the ops the warm-up runs on fixed inputs, and how many results differ from
the correctly rounded value. Run it on two machines and compare the lines: an op whose hash
differs rounds by the CPU. On an Intel Xeon (AVX-512, torch 2.11) and an AMD EPYC (Zen 3,
torch 2.13) the cos, sin, exp and log lines were equal (cos ``4eb4d816a71a``, exp float64
``83b348d49183``) and ``torch.sqrt`` on float64 was not (``1a084e51e692`` on the EPYC): MKL's
vector math puts ~1.4% of those square roots one ulp off, not the same ones. In the same probe
with other inputs, the unfused AdamW's float64 result differed between the two and the fused
one's (ATen's square root) was equal. CPU only, seconds.
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from evolm.model.tiny.pinned import PINNED_KERNELS


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:12]


def correctly_rounded(fn: object, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``fn`` (a :mod:`math` function) of each value, in float64, rounded to ``dtype``."""
    values = [fn(v) for v in x.double().flatten().tolist()]  # type: ignore[operator]
    return torch.tensor(values, dtype=torch.float64).to(dtype).view_as(x)


def adamw(fused: bool, steps: int = 5) -> torch.Tensor:
    """A float64 parameter after ``steps`` AdamW steps on fixed gradients."""
    generator = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(1000, dtype=torch.float64, generator=generator))
    opt = torch.optim.AdamW([p], lr=1e-2, weight_decay=0.0, fused=fused)
    for i in range(steps):
        p.grad = torch.sin(torch.arange(1000, dtype=torch.float64) * (i + 1))
        opt.step()
    return p.detach()


def probe() -> list[str]:
    """One line per op: its name, the hash of its results and how many are not correctly
    rounded (where a reference exists)."""
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))  # RoPE's angles
    angles = (inv_freq[:, None] * torch.arange(2048, dtype=torch.float32)[None, :]).contiguous()
    small = torch.rand(100000, dtype=torch.float64, generator=generator) * 1e-3
    normal = torch.randn(100000, dtype=torch.float64, generator=generator)
    lines = []
    for name, fn, x in (
        ("cos float32 (RoPE)", math.cos, angles),
        ("sin float32 (RoPE)", math.sin, angles),
        ("sqrt float64", math.sqrt, small),
        ("exp float64", math.exp, normal),
        ("log float64", math.log, small),
    ):
        got = getattr(torch, name.split()[0])(x)
        off = int((got != correctly_rounded(fn, x, x.dtype)).sum())
        lines.append(f"{name}: {digest(got)}, {off} of {x.numel()} not correctly rounded")
    lines.append(f"exp float32: {digest(torch.exp(normal.float()))}")
    lines.append(f"tanh float32: {digest(torch.tanh(normal.float()))}")
    lines.append(f"AdamW float64, unfused: {digest(adamw(False))}")
    lines.append(f"AdamW float64, fused: {digest(adamw(True))}")
    return lines


def main() -> int:
    if os.environ.get("EVOLM_PROBE_CHILD") != "1":  # torch reads the pins when it loads
        env = {**os.environ, **PINNED_KERNELS, "EVOLM_PROBE_CHILD": "1"}
        return subprocess.call([sys.executable, "-m", "benchmarks.cpu_vendor"], env=env)
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in info if "model name" in line), "?")
    print(f"{cpu}, torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})")
    print("\n".join(probe()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
