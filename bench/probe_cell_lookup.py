"""Probe: can the tiny Qwen3-VL read one cell of a maze image? (the diagnosis of issue 19)

One question, "cell 4 3?" (the same cell of every 9x9 maze, answer " wall" or " free"), asked of a
freshly initialised tiny Qwen3VLForConditionalGeneration (full fine-tuning, fresh training mazes
every step, held-out accuracy on 256 mazes; the majority answer gets 50.4%). What the image tokens
carry and where they sit are the variables (docs/grounding.md has the measured table):

    .venv/bin/python -m bench.probe_cell_lookup --variant image                   # HF init (pos-embed std 0.02): 50.4%
    .venv/bin/python -m bench.probe_cell_lookup --variant image --pos-std 0.5     # 100% by step 25
    .venv/bin/python -m bench.probe_cell_lookup --variant blind --pos-std 0.5     # control: one fixed image, 50.4%
    .venv/bin/python -m bench.probe_cell_lookup --variant oracle2d                # '#'/'.' embeddings at 2D MRoPE positions
    .venv/bin/python -m bench.probe_cell_lookup --variant oracle1d                # the same at 1D positions: 100% by step 100
    .venv/bin/python -m bench.probe_cell_lookup --variant oracle2d --abs 1        # + a learned per-cell code
    .venv/bin/python -m bench.probe_cell_lookup --task rand --pos-std 0.5         # random cell named in the question

About 1 s a step on one core (it sets no thread count: run it with OMP_NUM_THREADS=1).
"""
import argparse
import json
import time

import numpy as np
import torch
from transformers import Qwen2VLImageProcessorPil, Qwen3VLForConditionalGeneration

from envs.visgym.maze import generate_maze
from envs.visgym.render import render_image
from rlkit.policy.tiny import TinyVLSizes, tiny_config
from rlkit.policy.tokenizer import IMAGE_PAD, VISION_END, VISION_START, build_tiny_tokenizer

p = argparse.ArgumentParser()
p.add_argument("--variant", default="image", choices=["image", "blind", "oracle2d", "oracle1d"])
p.add_argument("--task", default="cell", choices=["cell", "rand"], help="cell: fixed (4, 3); rand: a random interior cell named in the question")
p.add_argument("--steps", type=int, default=300)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--bs", type=int, default=32)
p.add_argument("--qk", type=float, default=1.0)  # init scale of q_norm/k_norm weights
p.add_argument("--tiny", default="{}")
p.add_argument("--mrope", default="")
p.add_argument("--eval_every", type=int, default=50)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--bf16", action="store_true")
p.add_argument("--clip", type=float, default=1.0)
p.add_argument("--sincos", type=float, default=0.0)
p.add_argument("--sincos_base", type=float, default=100.0)
p.add_argument("--abs", type=float, default=0.0)
p.add_argument("--pos-std", type=float, default=0.0, help="init std of the vision pos-embed (0 = HF default 0.02)")
a = p.parse_args()
torch.manual_seed(a.seed)
sizes = TinyVLSizes(**{**dict(text_hidden=192, text_layers=4, text_heads=6, text_kv_heads=2, head_dim=32,
                              text_intermediate=512), **json.loads(a.tiny)})
tok = build_tiny_tokenizer(sizes.vocab_size)
cfg = tiny_config(sizes, tok)
if a.mrope:
    cfg.text_config.rope_parameters["mrope_section"] = json.loads(a.mrope)
model = Qwen3VLForConditionalGeneration(cfg).float()
with torch.no_grad():
    for n, prm in model.named_parameters():
        if n.endswith("q_norm.weight") or n.endswith("k_norm.weight"):
            if "visual" not in n:
                prm.mul_(a.qk)
with torch.no_grad():
    if a.pos_std:
        model.model.visual.pos_embed.weight.normal_(0.0, a.pos_std)
    if a.sincos:
        W = model.model.visual.pos_embed.weight
        n, D = W.shape; side = int(round(n ** 0.5))
        k = torch.arange(D // 4, dtype=torch.float32)
        omega = 1.0 / (a.sincos_base ** (k / (D // 4)))
        ii = torch.arange(side, dtype=torch.float32)
        row = torch.cat([torch.sin(ii[:, None] * omega), torch.cos(ii[:, None] * omega)], 1)  # side, D/2
        emb = torch.cat([row[:, None, :].expand(side, side, D // 2), row[None, :, :].expand(side, side, D // 2)], 2)
        W.copy_(emb.reshape(n, D) * a.sincos)
ABS = torch.nn.Parameter(torch.randn(81, cfg.text_config.hidden_size) * 0.28 * a.abs) if a.abs else None
ip = Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=256,
                              max_pixels=72 * 72, image_mean=[.5] * 3, image_std=[.5] * 3)
ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]
VS, VE, PAD = (tok.convert_tokens_to_ids(t) for t in (VISION_START, VISION_END, IMAGE_PAD))
WALL, FREE = ids(" wall"), ids(" free")
assert len(WALL) == 1 and len(FREE) == 1
WALL, FREE = WALL[0], FREE[0]
HASH, DOT = ids("#")[0], ids(".")[0]


def sample(seed, rng):
    m, s, g = generate_maze(seed, 9)
    if a.task == "cell":
        r, c = 4, 3
    else:
        r, c = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    q = ids(f"cell {r} {c}?")
    return m, s, g, q, int(m[r, c])


FIXED = generate_maze(424242, 9)
pix_cache = {}


def pixels(m, s, g, key):
    if key not in pix_cache:
        out = ip(images=[render_image(m, s, g)], return_tensors="pt")
        pix_cache[key] = out["pixel_values"]
    return pix_cache[key]


def batch(seeds, rng):
    rows = []
    for sd in seeds:
        m, s, g, q, y = sample(sd, rng)
        rows.append((sd, m, s, g, q, y))
    L = 1 + 81 + 1 + max(len(r[4]) for r in rows)
    B = len(rows)
    input_ids = torch.full((B, L), tok.pad_token_id)
    att = torch.zeros(B, L, dtype=torch.long)
    pos = torch.zeros(3, B, L, dtype=torch.long)
    last = []
    pv = []
    embs = None
    E = model.get_input_embeddings().weight
    if a.variant.startswith("oracle"):
        embs = torch.zeros(B, L, E.shape[1])
    for i, (sd, m, s, g, q, y) in enumerate(rows):
        seq = [VS] + [PAD] * 81 + [VE] + q
        n = len(seq)
        off = L - n  # left pad
        input_ids[i, off:] = torch.tensor(seq)
        att[i, off:] = 1
        # positions
        pp = torch.zeros(3, n, dtype=torch.long)
        pp[:, 0] = 0
        rr, cc = np.divmod(np.arange(81), 9)
        twod = a.variant in ("image", "blind", "oracle2d")
        if twod:
            pp[0, 1:82] = 1
            pp[1, 1:82] = torch.tensor(1 + rr)
            pp[2, 1:82] = torch.tensor(1 + cc)
            nxt = 10
        else:
            pp[:, 1:82] = torch.arange(1, 82)
            nxt = 82
        pp[:, 82:] = torch.arange(nxt, nxt + n - 82)
        pos[:, i, off:] = pp
        if a.variant.startswith("oracle"):
            tok_ids = torch.tensor(seq)
            grid = torch.tensor(np.where(m.reshape(-1) == 1, HASH, DOT))
            tok_ids = tok_ids.clone(); tok_ids[1:82] = grid
            embs[i, off:] = 0  # filled below with grad
            rows[i] = (sd, m, s, g, q, y, tok_ids, off)
        else:
            if a.variant == "blind":
                pv.append(pixels(*FIXED, "fixed"))
            else:
                pv.append(pixels(m, s, g, sd))
    y = torch.tensor([r[5] for r in rows])
    return input_ids, att, pos, pv, y, rows


def forward(seeds, rng):
    input_ids, att, pos, pv, y, rows = batch(seeds, rng)
    if a.variant.startswith("oracle"):
        full = input_ids.clone()
        for i, r in enumerate(rows):
            full[i, r[7]:] = r[6]
        emb = model.get_input_embeddings()(full)
        if ABS is not None:
            emb = emb.clone()
            for i, r in enumerate(rows):
                emb[i, r[7] + 1:r[7] + 82] = emb[i, r[7] + 1:r[7] + 82] + ABS
        out = model(inputs_embeds=emb, attention_mask=att, position_ids=pos)
    else:
        B = len(seeds)
        out = model(input_ids=input_ids, attention_mask=att, position_ids=pos,
                    pixel_values=torch.cat(pv), image_grid_thw=torch.tensor([[1, 18, 18]] * B))
    logits = out.logits[:, -1, :].float()
    two = torch.stack([logits[:, FREE], logits[:, WALL]], 1)
    loss = torch.nn.functional.cross_entropy(logits, torch.where(y == 1, WALL, FREE))
    acc = (two.argmax(1) == y).float().mean().item()
    return loss, acc, y.float().mean().item()


opt = torch.optim.AdamW(list(model.parameters()) + ([ABS] if ABS is not None else []), lr=a.lr, weight_decay=0.0)
EVAL = list(range(5000, 5256))


def evaluate():
    model.eval()
    accs = []
    with torch.no_grad():
        r = np.random.default_rng(7)
        for k in range(0, 256, 64):
            _, acc, _ = forward(EVAL[k:k + 64], r)
            accs.append(acc)
    model.train()
    return float(np.mean(accs))


rng = np.random.default_rng(a.seed)
t0 = time.time()
nxt = 100000
hist = []
ctx = torch.autocast("cpu", dtype=torch.bfloat16) if a.bf16 else torch.autocast("cpu", enabled=False)
for step in range(1, a.steps + 1):
    seeds = list(range(nxt, nxt + a.bs)); nxt += a.bs
    with ctx:
        loss, acc, _ = forward(seeds, rng)
    opt.zero_grad(); loss.backward(); gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip); opt.step()
    if step % a.eval_every == 0 or step == a.steps:
        with ctx:
            ev = evaluate()
        hist.append((step, round(ev, 3)))
        print(f"step {step} loss {loss.item():.3f} train_acc {acc:.2f} eval {ev:.3f} gn {gn:.2f} t {time.time()-t0:.0f}s", flush=True)
print("RESULT", a.variant, a.task, a.tiny, a.mrope, "qk", a.qk, "lr", a.lr, hist)
