"""The local engine's fast path for Qwen2 / Llama decoders, cut like nano-vllm's engine.

- :mod:`.backend`: the local engine's fast path (texts in and out, adapter buffers, fp8);
- :mod:`.scheduler`: continuous batching: admission, slots, refill, rows sorted by member
  (a scheduling change goes here);
- :mod:`.runner`: one step: a prefill chunk or a decode step (CUDA graphs);
- :mod:`.workspace`: the static buffers and the graph-invalidation key;
- :mod:`.plan`: all memory sizing (how many slots fit, prefill chunks; one activation formula);
- :mod:`.model`: the forward (prefill, decode) over a static KV cache;
- :mod:`.weights`: fused projections over the HF model's own weights (what is supported);
- :mod:`.lora`: grouped multi-LoRA buffers (first factors in the weights' spare rows);
- :mod:`.ops`: the elementwise ops, eager, compiled or Triton (:mod:`evolm.engine.kernels`);
- :mod:`.fp8`: fp8 weights (``quantization=fp8``);
- :mod:`.cudagraph`: graph capture and phase timing.

Token choice is :mod:`evolm.engine.sampler` (shared with the HF path).
"""
