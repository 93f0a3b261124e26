"""A two-layer EAGLE, the recipe's third stage on the shipped EAGLE + TTT
(results/drafters/eagle-ttt-smollm2): its layer becomes the first of two, the second starting as
the identity (Eagle.warm_params: zero output projections), so the run starts drafting exactly as
EAGLE + TTT does and learns only what a second layer adds; 2-step training-time test and lr 1e-3
as that stage, 500 updates. EAGLE's paper drafts with one layer; HASS and EAGLE-3 keep one too,
so this asks whether depth buys acceptance on a 135M target whose one-layer drafters level off
at ~0.52 held out. Output in runs/eagle-deep-smollm2."""
import dataclasses

from speculax.configs.eagle_ttt_smollm2 import EXPERIMENT as EAGLE_TTT

EXPERIMENT = dataclasses.replace(
    EAGLE_TTT, name="eagle-deep-smollm2", init_from="results/drafters/eagle-ttt-smollm2",
    distill=dataclasses.replace(
        EAGLE_TTT.distill,
        drafter=dataclasses.replace(EAGLE_TTT.distill.drafter, draft_layers=2)))
