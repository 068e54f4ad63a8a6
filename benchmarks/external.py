"""External methods for the benchmark: evolm's server engines behind the :data:`Runner` hook.

A runner takes the workload, the P prompts as token ids ``[P, L]`` and the population, runs one
population evaluation, and returns ``{"tokens": <generated tokens>, ...extra timings}``. The
benchmark times the call. :func:`sglang_runner` drives ``evolm.server.sglang.SGLangEngine``
attached to a running server (what ``server=sglang`` does in a run): it writes every member as a
PEFT adapter, loads them, sends the generation, unloads, and its ``last_timings`` split that.

The server must serve a model of the benchmarked shape with a tokenizer: ``python -m
benchmarks --save-model DIR`` writes one (random weights + the tiny BPE tokenizer); start the
server on DIR (launchers/sglang_server.sh). evolm's SGLang engine sends text, so the prompts are
decoded from their ids and may re-tokenize to a slightly different length, and it does not force
``ignore_eos``: the returned token count says what was generated.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from benchmarks.methods import Runner, Workload
from evolm.lora import LoraPopulation
from evolm.sampling import Sampling


def sglang_runner(url: str, model_path: str) -> Runner:
    """A runner over evolm's SGLang engine attached to the server at ``url``."""
    engines: dict[str, Any] = {}

    def run(work: Workload, ids: Tensor, pop: LoraPopulation) -> dict[str, Any]:
        from evolm.server.options import RemoteOptions  # lazily: a server stack, not a GPU one
        from evolm.server.sglang import SGLangEngine

        engine = engines.get("e")
        if engine is None:
            engine = engines["e"] = SGLangEngine(
                model_path,
                pop.layout,
                RemoteOptions("sglang.launch_server", url=url, self_test=False),
                max_loras_per_batch=work.members + 1,
            )
        tok = engine.tokenizer
        # the saved model pairs the shape's vocabulary with the tiny BPE tokenizer: fold the
        # ids into the tokenizer's range, or they decode to empty prompts (HTTP 400)
        texts = tok.batch_decode((ids % len(tok)).tolist(), skip_special_tokens=True)
        out = engine.generate(texts, pop, Sampling(max_new_tokens=work.new_tokens), seed=0)
        tokens = sum(len(tok(text)["input_ids"]) for member in out for text in member)
        return {"tokens": tokens, **{f"sglang_{k}": v for k, v in engine.last_timings.items()}}

    return run
