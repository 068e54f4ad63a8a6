"""The local engine's eager path over the transformers modules: every target projection wrapped
in a multi-LoRA layer (:mod:`.multilora`), decoded by a written-out loop (:mod:`.generation`).
Any architecture transformers loads; the reference the fast path is tested against."""
