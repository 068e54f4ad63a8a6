"""Population-evaluation benchmark: ``python -m benchmarks`` (see :mod:`benchmarks.__main__`).

Times one ES generation's evaluation (N members x P prompts, forced new tokens) with evolm's
local engine, the base model on the same engine, the paper's perturb-in-place method, one HF
generate per member, and optionally an external engine; reports ratios, ES bookkeeping, peak
memory and a roofline floor. Needs torch and transformers only (no Hydra).
"""

from __future__ import annotations
