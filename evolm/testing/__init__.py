"""Stand-ins for what cannot run on a CPU machine (tests only; never imported by the product).

- :mod:`.sglang_standin`: an HTTP server that enforces SGLang 0.5.17's multi-LoRA API contract
  and generates with the local engine (``python -m evolm.testing.sglang_standin``).
"""
