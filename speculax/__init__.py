"""speculax: speculative decoding research in JAX.

    import speculax as sx
    model = sx.load("smollm2-135m")                       # a preset, a .gguf file or an HF folder
    out = sx.generate(model, ["Write a haiku about JAX."], max_new_tokens=64)
    out = sx.speculate(model, ["..."], "prompt-lookup", k=5)      # same output, fewer forwards
    eagle = sx.train_drafter(model, sx.drafters.Eagle(), corpus=texts, steps=100)
    eagle = sx.drafters.load("runs/eagle-smollm2")                 # or a finished run folder

Every layer is a subpackage (core < models < verifiers < drafters < decode < train < serve <
cli, configs, research); this module is the short way in.
"""
from speculax import drafters
from speculax.api import generate, load, speculate, train_drafter

__all__ = ["drafters", "generate", "load", "speculate", "train_drafter"]
