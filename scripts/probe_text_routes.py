#!/usr/bin/env python
"""Probe: does the tiny policy's language model learn 7x7 routes from the walls written as text, on
mazes it never trained on? (issue 19: the last held-out mazes fail on planning, not reading)

Session 16 measured `env.parser=plan_walls`: the policy transcribes every evaluation maze exactly and
still writes 25% of the routes wrong (the route of a trained-on neighbour). This probe asks whether that
is the 704 training layouts or the model: the same language model (the tiny Qwen3-VL's decoder, random
init, text only, no image) is trained on

    "walls a#b.c#... from 1,1 to 5,5:" -> " right right down down ... stop"

from one of several task pools, and measured on the 64 mazes of visgym_small_64 (corner to corner),
whose walls no pool contains (a stricter holdout than the default's: no task on a held-out tree at all):

- ``corner``: the corner tasks of the trees left (the task shape of the default's training set);
- ``room``: those trees with start and goal on two random rooms (rlkit's room tasks, 72 pairs a tree);
- ``graph``: any wall bits (each open with p 0.5-0.8), two random connected rooms: 7x7 graphs with loops,
  the most diverse pool (thousands of wall patterns; the held-out trees' patterns excluded).

Held-out success is exact-match of the greedy route (teacher-forced argmax over the whole answer, which is
what greedy decoding writes). About 0.1 s a step of 64 on one core (OMP_NUM_THREADS=1).

    .venv/bin/python scripts/probe_text_routes.py --pool corner
    .venv/bin/python scripts/probe_text_routes.py --pool corner,room,graph
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import argparse
import json
import time

import numpy as np
import torch
from transformers import Qwen3VLForConditionalGeneration

from envs.visgym.grounding import walls_answer, wall_bit_cells
from envs.visgym.maze import MOVE_NAMES, ROOM_TASKS, generate_maze, solve_moves
from envs.visgym.spec import EVAL_SETS
from rlkit.policy.tiny import TinyVLSizes, tiny_config
from rlkit.policy.tokenizer import build_tiny_tokenizer

p = argparse.ArgumentParser()
p.add_argument("--pool", default="corner", help="comma list of corner, room, graph (drawn evenly)")
p.add_argument("--steps", type=int, default=2000)
p.add_argument("--bs", type=int, default=64)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--eval-every", type=int, default=100)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--tiny", default="{}", help="JSON overrides of TinyVLSizes")
p.add_argument("--out", default="")
a = p.parse_args()
torch.manual_seed(a.seed)
rng = np.random.default_rng(a.seed)
SIZE = 7
sizes = TinyVLSizes(**json.loads(a.tiny))
tok = build_tiny_tokenizer(sizes.vocab_size)
model = Qwen3VLForConditionalGeneration(tiny_config(sizes, tok))  # fp32 weights, bf16 autocast compute
opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=a.lr, weight_decay=0.0)
ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]


def text(maze_map, start, goal):
    prompt = f"walls {walls_answer(maze_map)[0]} from {start[0]},{start[1]} to {goal[0]},{goal[1]}:"
    route = " " + " ".join(MOVE_NAMES[m] for m in solve_moves(maze_map, start, goal)) + " stop"
    return ids(prompt), ids(route)


held = [generate_maze(s, SIZE) for s in EVAL_SETS["visgym_small_64"].seeds]
held_walls = {m.tobytes() for m, _, _ in held}
rooms = [(r, c) for r in range(1, SIZE - 1, 2) for c in range(1, SIZE - 1, 2)]
bits = wall_bit_cells(SIZE)


def connected(m, s, g):
    try:
        solve_moves(m, s, g)
        return True
    except Exception:
        return False


def draw(pool):
    while True:
        if pool in ("corner", "room"):
            seed = int(rng.integers(2**31))
            m, s, g = generate_maze(ROOM_TASKS + seed if pool == "room" else seed, SIZE)
        else:
            m = np.ones((SIZE, SIZE), dtype=np.int64)
            m[1:-1:2, 1:-1:2] = 0
            p_open = rng.uniform(0.5, 0.8)
            for (r, c) in bits:
                m[r, c] = 0 if rng.random() < p_open else 1
            i, j = rng.choice(len(rooms), 2, replace=False)
            s, g = rooms[i], rooms[j]
            if not connected(m, s, g):
                continue
        if m.tobytes() not in held_walls:
            return m, s, g


def batch(examples):
    seqs = [(q + r, len(q)) for q, r in examples]
    L = max(len(x) for x, _ in seqs)
    inp = torch.full((len(seqs), L), tok.pad_token_id)
    lab = torch.full((len(seqs), L), -100)
    att = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, (x, n) in enumerate(seqs):
        inp[i, : len(x)] = torch.tensor(x)
        att[i, : len(x)] = 1
        lab[i, n : len(x)] = torch.tensor(x[n:])
    return inp, att, lab


HELD = batch([text(*t) for t in held])


@torch.no_grad()
def evaluate():
    model.eval()
    inp, att, lab = HELD
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=inp, attention_mask=att).logits[:, :-1]
    pred, tgt = logits.argmax(-1), lab[:, 1:]
    ok = ((pred == tgt) | (tgt == -100)).all(1)
    model.train()
    return ok.float().mean().item()


pools = a.pool.split(",")
log, t0 = [], time.time()
for step in range(a.steps + 1):
    if step % a.eval_every == 0:
        acc = evaluate()
        log.append(dict(step=step, held_out=acc, s=round(time.time() - t0, 1)))
        print(f"step {step:5d}  held-out route exact {acc:6.1%}  ({time.time() - t0:.0f} s)", flush=True)
    if step == a.steps:
        break
    inp, att, lab = batch([text(*draw(pools[k % len(pools)])) for k in range(a.bs)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=inp, attention_mask=att, labels=lab).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
if a.out:
    Path(a.out).write_text(json.dumps(dict(args=vars(a), log=log), indent=1))
