"""The local engine's fast path for Qwen2 / Llama decoders.

- :mod:`.weights`: fused projections over the HF model's own weights (what is supported);
- :mod:`.lora`: grouped multi-LoRA buffers (first factors in the weights' spare rows);
- :mod:`.model`: the forward (prefill, decode) over a static KV cache;
- :mod:`.runner`: population generation (chunked prefill, CUDA-graph decode steps);
- :mod:`.ops`: the elementwise ops, eager, compiled or Triton (:mod:`evolm.engine.kernels`);
- :mod:`.cudagraph`: graph capture and phase timing.
"""
