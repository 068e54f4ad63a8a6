"""The local engine's fast path for Qwen2 / Llama decoders, cut like nano-vllm's engine.

- :mod:`.scheduler`: continuous batching: admission, slots, refill, rows sorted by member
  (a scheduling change goes here);
- :mod:`.runner`: one step: a prefill chunk or a decode step (CUDA graphs);
- :mod:`.workspace`: the static buffers, the graph-invalidation key, the sizing constants;
- :mod:`.plan`: the memory planner (how many slots fit);
- :mod:`.model`: the forward (prefill, decode) over a static KV cache;
- :mod:`.weights`: fused projections over the HF model's own weights (what is supported);
- :mod:`.lora`: grouped multi-LoRA buffers (first factors in the weights' spare rows);
- :mod:`.ops`: the elementwise ops, eager, compiled or Triton (:mod:`evolm.engine.kernels`);
- :mod:`.fp8`: fp8 weights (``quantization=fp8``);
- :mod:`.cudagraph`: graph capture and phase timing.

Token choice is :mod:`evolm.engine.sampler` (shared with the HF path).
"""
