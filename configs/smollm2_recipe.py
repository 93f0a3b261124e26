"""The drafter-training recipe shared by the *_smollm2.py experiments (SmolLM2-135M, frozen).

Data that matches serving: the target's own answers (chat template; prompt i greedy or sampled
at t = 1 in turn) to 1200 self-distillation prompts (train/prompts.mixture: stdlib function
instructions, pydoc topic questions, everyday chat questions; none shares a subject with the
held-out prompts or a 13-word run with HumanEval), plus 20% raw stdlib code; held out: answers
to the held-out split's prompts. About 360k tokens in rows of 256. The answers ship with the
repository (results/drafters/recipe-answers, 6.2 MB: it also holds answers to the other 3225
training prompts, which this recipe does not read; 33-43 minutes of generation per 1200 here);
the teacher caches live in runs/drafters/teacher, shared by every drafter (each built once,
resumable; a cache that holds more features than a drafter needs serves it too, so the draft
model reads the head drafters' cache).
Head drafters train on the VOCAB_TRIM most frequent training tokens only (VocabTrim): their
output layer costs a third of the full one, in training and when drafting. Objective: LK,
-log of the expected acceptance (held-out 1 - TV of EAGLE after 100 updates: fkl 0.337, lk
0.342 at lr 1e-3, lk 0.363 at 3e-3); 1200 updates of 8 rows, 40 min for EAGLE on 2 cores.
"""
from speculax.train.experiment import DataConfig
from speculax.train.optim import OptimConfig

DATA = DataConfig(corpus="mixed", files=None, seq_len=256, rows=1400, heldout_rows=32, top_k=32,
                  prompts=1200, answer_tokens=192, temperatures=(0.0, 1.0), code_fraction=0.2,
                  answers_dir="results/drafters/recipe-answers")
TEACHER_DIR = "runs/drafters/teacher"
DIVERGENCE = "lk"
VOCAB_TRIM = 16384


def optim(steps: int = 1200, learning_rate: float = 3e-3) -> OptimConfig:
  """AdamW with a 5% warmup and a cosine decay to zero over `steps` updates."""
  return OptimConfig(learning_rate=learning_rate, warmup_steps=max(steps // 20, 1),
                     total_steps=steps)
