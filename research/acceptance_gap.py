"""Why decoding keeps fewer first drafts than a drafter's held-out 1 - TV promises.

For each trained drafter, its first draft scored teacher-forced (the training path: the
drafter's train_outputs, or the draft model's forward) against the target's exact law, on the
positions a decode loop drafts at:

  held-out rows    the recipe's held-out rows, every position a head drafter drafts at (the
                   rows train_drafters' held-out figures read, here the drafter as it serves:
                   its own kept ids)
  held-out greedy  the target's greedy answers to the held-out split's prompts, answer positions
  held-out t=1     the same for the answers sampled at temperature 1
  <suite> answers  the target's greedy answers to a bench suite's prompts (the bench's prompts)
  <suite> replay   the k = 1 greedy loop replayed on those answers from the teacher-forced
                   top-1 (a kept draft moves two tokens on, a rejected one one)
  <suite> decode   the k = 1 greedy loop's measured first-draft acceptance on the same prompts

Greedy decoding keeps a draft iff its argmax is the target's, so "replay" must equal "decode"
(the serving path drafts what training scored); the gap between the held-out columns and the
suites' is then the data's, not the loop's.

  .venv/bin/python -m speculax.research.acceptance_gap [--drafters FOLDER ...] [--out results]
  .venv/bin/python -m speculax.research.acceptance_gap --report results/acceptance_gap.json
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from speculax.bench import suites
from speculax.bench.measure import machine, run_prompts
from speculax.bench.report import table
from speculax.configs.smollm2_recipe import DATA
from speculax.decode.config import SpecConfig
from speculax.drafters import heads_io, registry, vocab_trim
from speculax.drafters.draft_model import DraftModel
from speculax.models import llama
from speculax.models.load import load
from speculax.research.common import add_target_and_out
from speculax.train import corpus
from speculax.train.heads import frozen_params
from speculax.train.teacher_cache import params_fingerprint

DISTILLED = pathlib.Path("runs/distill-smollm2-fkl")  # the recipe's draft model, when trained


def default_folders() -> list[pathlib.Path]:
  """The shipped drafters, and the recipe's distilled draft model where it was trained."""
  found = sorted(p for p in pathlib.Path("results/drafters").glob("*-smollm2"))
  return [p for p in [*found, DISTILLED] if heads_io.is_saved(p)]


@functools.partial(jax.jit, static_argnames=("drafter", "config"))
def first_draft(drafter, params, frozen, config, tokens) -> dict[str, jax.Array]:
  """At each target position m [b, t], of the drafter's first draft of token m + 1 (teacher-
  forced on tokens [b, t]): top1, whether it is the target's argmax there; accept, its 1 - TV
  against the target's law; q_top, its top probability; and p_top, the target's top probability
  at m. Position 0 is undefined for head drafters (they draft from position m - 1's features)."""
  positions = llama.row_positions(*tokens.shape)
  layers = tuple(getattr(drafter, "hidden_layers", ()))
  logits, hidden, _ = llama.forward(frozen, config, tokens, positions,
                                    hidden_layers=layers or (-1,))
  if isinstance(drafter, DraftModel):
    q = llama.forward(params, drafter.config, tokens, positions)[0]  # [b, t, v] law of m + 1
  else:  # depth 1 at position i is the law of token i + 2: the target's at i + 1
    batch = {"tokens": tokens, "hidden": hidden, "mask": jnp.ones(tokens.shape, jnp.float32)}
    z = drafter.train_outputs(params, frozen, config, batch, jax.random.key(0))["logits"][:, :, 0]
    if vocab_trim.TRIM in frozen:  # [b, t, n] over the kept ids
      z = vocab_trim.full_vocabulary(frozen[vocab_trim.TRIM], z, config.vocab_size)
    q = jnp.concatenate([jnp.full_like(z[:, :1], -jnp.inf).at[..., 0].set(0.0), z[:, :-1]], 1)
  p, q = jax.nn.softmax(logits.astype(jnp.float32)), jax.nn.softmax(q.astype(jnp.float32))
  return {"top1": jnp.argmax(q, -1) == jnp.argmax(p, -1), "accept": jnp.minimum(p, q).sum(-1),
          "q_top": q.max(-1), "p_top": p.max(-1)}


def replay_k1(top1: np.ndarray, start: int, length: int) -> tuple[int, int]:
  """(drafts kept, verify steps) of the k = 1 greedy loop on one greedy answer, from the
  teacher-forced top-1 per target position [t]: the answer's tokens sit at start .. length - 1;
  with g of them out, the loop drafts token start + g from target position start + g - 1."""
  kept = steps = 0
  g = 1  # the prefill's token
  while g < length - start:
    ok = bool(top1[start + g - 1])
    kept, steps, g = kept + ok, steps + 1, g + 1 + ok
  return kept, steps


def first_draft_signals(drafter, params, model, docs: list[list[int]], starts: list[int],
                        batch: int = 2) -> dict[str, list[np.ndarray]]:
  """first_draft's arrays over each doc's drafted positions (prompt + answer, the answer from
  starts[i]: target positions starts[i] .. len - 2, whose next token a loop drafts), a list of
  arrays per name, one per doc."""
  order = params.get(vocab_trim.IDS)  # a trimmed drafter's kept ids come first
  params = {k: v for k, v in params.items() if k != vocab_trim.IDS}
  frozen = model.params if isinstance(drafter, DraftModel) else frozen_params(
      drafter, params, model.params, model.config, order)
  t = -(-max(map(len, docs)) // 64) * 64  # one compile per 64-token bucket
  out: dict[str, list[np.ndarray]] = {}
  for lo in range(0, len(docs), batch):
    part = docs[lo:lo + batch]
    rows = np.stack([np.pad(d, (0, t - len(d)), mode="edge") for d in part + part[-1:] *
                     (batch - len(part))]).astype(np.int32)
    got = jax.tree.map(np.asarray, first_draft(drafter, params, frozen, model.config,
                                                jnp.asarray(rows)))
    for r, (d, s) in enumerate(zip(part, starts[lo:lo + batch])):
      for name, a in got.items():
        out.setdefault(name, []).append(a[r, s:len(d) - 1])
  return out


def score(drafter, params, model, docs: list[list[int]], starts: list[int],
          batch: int = 2) -> dict:
  """Teacher-forced first-draft metrics over the drafted positions of docs (prompt + answer,
  the answer from starts[i]): mean 1 - TV and top-1, and the k = 1 replay's acceptance."""
  got = first_draft_signals(drafter, params, model, docs, starts, batch)
  kept = steps = 0
  for top1 in got["top1"]:  # drafted positions only: the answer starts at 0, one token longer
    a, n = replay_k1(top1, 0, len(top1) + 1)
    kept, steps = kept + a, steps + n
  return {"accept": float(np.concatenate(got["accept"]).mean()),
          "top1": float(np.concatenate(got["top1"]).mean()), "replay": kept / max(steps, 1),
          "positions": int(sum(map(len, got["top1"])))}


def heldout_rows(model) -> tuple[list[list[int]], list[int]]:
  """The recipe's held-out rows (ids) and where scoring starts in each: position 1, the first
  a head drafter drafts from (its draft of token 2 reads position 0's feature)."""
  held = corpus.token_rows(DATA, model, DATA.answers_dir, params_fingerprint(model.params))[1]
  return [row.tolist() for row in held.tokens], [1] * len(held.tokens)


def heldout_answers(model, limit: int) -> dict[str, tuple[list[list[int]], list[int]]]:
  """The recipe's held-out answers (prompt + answer ids, answer start), greedy and t=1 apart."""
  asked, _ = corpus.split_prompts(DATA, "heldout")
  asked = asked[:limit]
  docs = corpus.answers(pathlib.Path(DATA.answers_dir) / "answers_heldout", model.params,
                        model.config, model.tokenizer, asked, max_new_tokens=DATA.answer_tokens,
                        temperatures=DATA.temperatures, batch_size=DATA.generate_batch,
                        fingerprint=params_fingerprint(model.params))
  out = {}
  heads = corpus.prompt_lengths(model.tokenizer, asked, docs)
  for i, (doc, head) in enumerate(zip(docs, heads)):
    greedy = DATA.temperatures[i % len(DATA.temperatures)] == 0
    d, s = out.setdefault("held-out greedy" if greedy else "held-out t=1", ([], []))
    d.append(doc)
    s.append(head)
  return out


def plot(rows: dict, sets: list[str], suite_names: list[str], path: pathlib.Path) -> pathlib.Path:
  """Grouped bars per drafter: top-1 teacher-forced on each position set, then each suite's
  decode acceptance."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  bars = [(f"{c} (top-1)", lambda r, c=c: r[c]["top1"]) for c in sets]
  bars += [(f"{s} decode", lambda r, s=s: r[f"{s} decode"]) for s in suite_names]
  fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(rows)), 4))
  width = 0.8 / len(bars)
  for j, (label, get) in enumerate(bars):
    ax.bar([i + j * width for i in range(len(rows))], [get(r) for r in rows.values()], width,
           label=label)
  ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], list(rows), fontsize=8)
  ax.set_ylabel("first draft kept / agreement")
  ax.legend(fontsize=7, ncol=2)
  ax.set_title("First draft: teacher-forced on each position set vs the k = 1 greedy loop")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  add_target_and_out(ap)
  ap.add_argument("--drafters", nargs="*", type=pathlib.Path, default=None,
                  help="trained drafter folders (default: results/drafters/*-smollm2 and "
                       f"{DISTILLED} if trained)")
  ap.add_argument("--suites", nargs="*", default=["humaneval", "chat"])
  ap.add_argument("--prompts", type=int, default=3, help="prompts per suite (the bench's 3)")
  ap.add_argument("--new-tokens", type=int, default=48)
  ap.add_argument("--heldout", type=int, default=40, help="held-out prompts (half greedy)")
  ap.add_argument("--report", type=pathlib.Path, default=None,
                  help="print the table of a saved acceptance_gap.json and stop")
  args = ap.parse_args()
  if args.report is not None:
    print(report(json.loads(args.report.read_text())))
    return
  folders = default_folders() if args.drafters is None else args.drafters
  if not folders:
    ap.error("no trained drafters found; train one (research/train_drafters.py) or pass --drafters")
  model = load(args.model)
  spec = SpecConfig(k=1, max_new_tokens=args.new_tokens)
  sets = {"held-out rows": heldout_rows(model), **heldout_answers(model, args.heldout)}
  prompts = {}
  for name in args.suites:
    ids = suites.encode(model.tokenizer, suites.suite(name, args.prompts))
    answers = run_prompts(model, ids, None, None, spec).tokens
    prompts[name] = ids
    sets[f"{name} answers"] = ([p + a for p, a in zip(ids, answers)], [len(p) for p in ids])
  rows = {}
  for folder in folders:
    drafter, params = registry.load(folder, model)
    row = rows[folder.name] = {}
    for name, (docs, starts) in sets.items():
      row[name] = score(drafter, params, model, docs, starts)
    for name, ids in prompts.items():
      run = run_prompts(model, ids, drafter, params, spec)
      row[f"{name} decode"] = run.acceptance[0]
    print(folder.name, json.dumps(row), flush=True)
    jax.clear_caches()
  result = {"machine": machine(), "date": datetime.date.today().isoformat(),
            "command": "python -m speculax.research.acceptance_gap", "suites": args.suites,
            "prompts": args.prompts, "new_tokens": args.new_tokens, "heldout": args.heldout,
            "rows": rows}
  args.out.mkdir(parents=True, exist_ok=True)
  path = args.out / "acceptance_gap.json"
  path.write_text(json.dumps(result, indent=1))
  print(report(result))
  figure = plot(rows, position_sets(rows), args.suites, args.out / "acceptance_gap.png")
  print(f"wrote {path} and {figure}")


def position_sets(rows: dict) -> list[str]:
  """The teacher-forced position sets of a result's rows, in their order."""
  return [c for c, v in next(iter(rows.values())).items() if isinstance(v, dict)]


def report(result: dict) -> str:
  """The README's table of a run's JSON."""
  rows, suite_names = result["rows"], result["suites"]
  cols = position_sets(rows)
  return (f"`{result['command']}` on {result['machine']}, {result['date']}: first draft, "
          "1 - TV (top-1) teacher-forced; k = 1 greedy loop replayed / decoded\n\n"
          + table(["drafter"] + cols + [f"{s} replay / decode" for s in suite_names],
                  [[n] + [f"{r[c]['accept']:.3f} ({r[c]['top1']:.2f})" for c in cols]
                   + [f"{r[f'{s} answers']['replay']:.2f} / {r[f'{s} decode']:.2f}"
                      for s in suite_names] for n, r in rows.items()]))


if __name__ == "__main__":
  main()
