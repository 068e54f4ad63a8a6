"""Clients of persistent multi-LoRA servers (``server=sglang|vllm``), their HTTP and process
helpers, and the per-process engine pool that lets a sweep's trials share one engine.

The in-process engine (``server=local``) is :mod:`evolm.engine.local`; the config group keeps
the name ``server`` for every engine.
"""
