"""Drafters: every kind of `registry.KINDS`, built by name or loaded from a training run.

    d = speculax.drafters.make("prompt-lookup", model)       # a LoadedDrafter (drafter, params)
    d = speculax.drafters.load("runs/eagle-smollm2", model)  # any trained kind
    d = speculax.drafters.make("eagle", model, heads="runs/eagle-smollm2", lookup=2)  # copies first
"""
from speculax.drafters.base import Drafter
from speculax.drafters.draft_model import DraftModel
from speculax.drafters.eagle import Eagle
from speculax.drafters.hydra import Hydra
from speculax.drafters.layer_skip import LayerSkip
from speculax.drafters.lookup_first import LookupFirst
from speculax.drafters.medusa import Medusa
from speculax.drafters.prompt_lookup import PromptLookup
from speculax.drafters.registry import KINDS, TRAINED, LoadedDrafter, load, make
from speculax.drafters.token_recycling import TokenRecycling

__all__ = ["Drafter", "DraftModel", "Eagle", "Hydra", "KINDS", "LayerSkip", "LoadedDrafter",
           "LookupFirst", "Medusa", "PromptLookup", "TRAINED", "TokenRecycling", "load", "make"]
