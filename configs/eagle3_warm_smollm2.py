"""EAGLE-3 as a second stage on the shipped EAGLE (results/drafters/eagle-smollm2): layers 2 and
15 fused with the final-normed feature EAGLE reads (where EAGLE-3's paper takes layer n - 3), the
fusion starting as that feature alone (Eagle.warm_params), so the run starts drafting as EAGLE
does and learns what the lower layers add, with 3-step training-time test; 500 updates at lr
1e-3 as the EAGLE + TTT stage. The fresh EAGLE-3 (configs/eagle3_smollm2.py) ends below EAGLE
at depth 1 (0.370 against 0.524 held out). Output in runs/eagle3-warm-smollm2; shipped as
results/drafters/eagle3-smollm2 (`research/train_drafters.py --drafters eagle3_warm --ship
eagle3-smollm2`)."""
import dataclasses

from speculax.configs.eagle3_smollm2 import EXPERIMENT as EAGLE3
from speculax.configs.smollm2_recipe import optim

EXPERIMENT = dataclasses.replace(
    EAGLE3, name="eagle3-warm-smollm2", init_from="results/drafters/eagle-smollm2",
    distill=dataclasses.replace(
        EAGLE3.distill, optim=optim(steps=500, learning_rate=1e-3),
        drafter=dataclasses.replace(EAGLE3.distill.drafter, feature_layers=(2, 15, -1))))
