"""evolm: fine-tune LLMs with Evolution Strategies over LoRA adapters."""

__version__ = "0.1.0"
