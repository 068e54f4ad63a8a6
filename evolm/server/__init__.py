"""Clients of persistent multi-LoRA servers (``server=sglang|vllm``) and their HTTP and process
helpers.

The in-process engine (``server=local``) is :mod:`evolm.engine.local`, and the per-process
engine pool that lets a sweep's trials share one engine is :mod:`evolm.app.pool`; the config
group keeps the name ``server`` for every engine.
"""
