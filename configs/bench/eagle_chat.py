"""The shipped EAGLE + TTT against it continued on more chat (results/drafters/eagle-chat-smollm2,
configs/eagle_chat_smollm2.py), on twice that chat (results/drafters/eagle-chat2-smollm2,
configs/eagle_chat2_smollm2.py), then leaning on its first draft (results/drafters/
eagle-chat2-decay-smollm2, configs/eagle_chat2_decay_smollm2.py) and on a third and a fourth round
of chat (results/drafters/eagle-chat3-smollm2, configs/eagle_chat3_smollm2.py; eagle-chat4-smollm2,
configs/eagle_chat4_smollm2.py), alone at k = 1 and 2 and behind prompt lookup at k = 3, batch 1
greedy, both suites; the fourth round also behind lookup at k = 4, 6, 7 and 8 (issue 18's tau >= 3).

  speculax bench --config eagle_chat --out runs/bench   (~30 min on 2 CPU cores)
"""
from speculax.bench.config import BenchConfig, method

SHIPPED = (("eagle-ttt", "eagle-ttt-smollm2"), ("eagle-chat", "eagle-chat-smollm2"),
           ("eagle-chat2", "eagle-chat2-smollm2"),
           ("eagle-chat2-decay", "eagle-chat2-decay-smollm2"),
           ("eagle-chat3", "eagle-chat3-smollm2"), ("eagle-chat4", "eagle-chat4-smollm2"))
BENCH = BenchConfig(
    methods=tuple(method(f"{name}{label}", "eagle", **kw, heads=f"results/drafters/{folder}")
                  for label, kw in ((" k=1", dict(k=1)), (" k=2", dict(k=2)),
                                    (" + lookup k=3", dict(k=3, lookup=2)))
                  for name, folder in SHIPPED)
    + tuple(method(f"eagle-chat4 + lookup k={k}", "eagle", k=k, lookup=2,
                   heads=f"results/drafters/{dict(SHIPPED)['eagle-chat4']}")
            for k in (4, 6, 7, 8)),
    suites=("humaneval", "chat"), prompts=3, batch_sizes=(1,), temperatures=(0.0,), new_tokens=48,
    repeats=2)
