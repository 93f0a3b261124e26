"""A judge head for SmolLM2 (verifiers/judge.py, LOSSY), trained as train/judge.py describes: the
target answers instructions built from standard-library functions (never HumanEval), greedy and
sampled (t = 1) alternately; its own answer tokens are the correct examples, tokens it ranks
outside its top `--wrong-rank` at a slot of an answer the incorrect ones. A tenth of the answers
is held out: the judge's share of correct tokens kept and incorrect ones refused there is
printed and saved beside the head. Serve it with `speculax generate --lossy-judge FILE` or
`research/lossy_quality.py --judge FILE`.

  .venv/bin/python -m speculax.research.train_judge [--prompts 96] [--out runs/results]
"""
from __future__ import annotations

import argparse
import json

from speculax.bench.measure import machine
from speculax.core.sampling import SamplingConfig
from speculax.models.load import load
from speculax.research.common import add_target_and_out
from speculax.train import data
from speculax.train import judge as training


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  add_target_and_out(ap)
  ap.add_argument("--prompts", type=int, default=96, help="training instructions answered")
  ap.add_argument("--answer-tokens", type=int, default=128)
  ap.add_argument("--negatives", type=int, default=8, help="corrupted copies per answer")
  ap.add_argument("--wrong-rank", type=int, default=20)
  ap.add_argument("--threshold", type=float, default=0.5)
  args = ap.parse_args(argv)
  cfg = training.JudgeTraining(negatives=args.negatives, wrong_rank=args.wrong_rank,
                               threshold=args.threshold)
  model = load(args.model)
  tok = model.tokenizer
  prompts = [tok.encode(tok.chat_prompt(p))
             for p in data.prompt_sets(limit=args.prompts).train]
  answers = []
  for temperature, part in ((0.0, prompts[0::2]), (1.0, prompts[1::2])):
    answers += zip(part, data.generate_batched(
        model.params, model.config, part, max_new_tokens=args.answer_tokens, batch_size=8,
        sampling=SamplingConfig(temperature=temperature), eos_ids=tok.eos_ids))
  answers = [(p, a) for p, a in answers if len(a) >= 2]
  rows, starts = [p + a for p, a in answers], [len(p) for p, _ in answers]
  width = -(-max(map(len, rows)) // 64) * 64  # one compile for every row
  held = max(1, len(rows) // 10)
  x, y = training.examples(model.params, model.config, rows[held:], starts[held:], cfg, width)
  hx, hy = training.examples(model.params, model.config, rows[:held], starts[:held], cfg, width)
  judge = training.fit(x, y, cfg)
  report = {"train": training.accuracy(judge, x, y), "heldout": training.accuracy(judge, hx, hy),
            "examples": {"train": len(y), "heldout": len(hy)}, "answers": len(rows),
            "settings": vars(args) | {"out": str(args.out)}, "machine": machine()}
  path = judge.save(args.out / "judge-smollm2.npz")
  path.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
  print(json.dumps(report, indent=1))
  print(f"wrote {path}: {int(y.sum())} correct and {int((1 - y).sum())} incorrect training "
        f"examples")


if __name__ == "__main__":
  main()
