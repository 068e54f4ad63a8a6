"""The local engine's eager path over the transformers modules (:mod:`.backend`): every target
projection wrapped in a multi-LoRA layer (:mod:`.multilora`), decoded by a written-out loop
(:mod:`.generation`); the KL to the base model (:mod:`.kl`, both paths).
Any architecture transformers loads; the reference the fast path is tested against."""
