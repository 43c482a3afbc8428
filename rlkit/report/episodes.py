"""Pictures of evaluation episodes: the task's first image with the path the policy took drawn on it.

Used by the training loop's evaluation table (W&B ``eval/samples``) and by the run report's
trajectory strips. Which drawing is used for an env (first match):

1. the env spec's own ``render_trajectory(seed, infos) -> PIL.Image`` method, if it has one
   (``infos``: the per-turn ``StepOutput.info`` dicts of the episode, in order);
2. a built-in drawer for the env spec's class (``DRAWERS``; VisGym maze_2d below);
3. the episode's first observation image, re-created with ``env_spec.make().reset(seed)``.

The VisGym drawer uses only the env package's public functions: ``generate_maze`` for the layout,
``MazeEnv`` (the gymnasium env, upstream dynamics) to replay the executed actions and collect the
visited cells, ``render_image`` for the picture. The executed actions come from the per-turn info
``action`` (interactive: ``"move right"`` / ``"stop"`` / None for an unparsable turn; plan mode:
the executed route words, ``"right right down stop"``; see envs/visgym/episode.py), so the path is
what the env executed, walls included (a move into a wall leaves the agent in place).

Episodes stored as text (``eval/<tag>.json``: seed + raw model outputs per turn) are replayed
through the env itself (``replay``) to get those infos back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from PIL import Image, ImageDraw, ImageFont

PATH_COLOUR = (255, 140, 0)  # orange polyline through the visited cells
OK_COLOUR = (0, 170, 0)  # disc on the final cell: stopped on the goal
FAIL_COLOUR = (0, 0, 0)  # cross on the final cell: stopped off the goal
OPEN_COLOUR = (110, 110, 110)  # ring on the final cell: no stop (budget or parse failures)


@dataclass
class Replayed:
    """An episode replayed from its seed and raw outputs: per-turn infos, success, turns used."""

    seed: int
    infos: list[dict[str, Any]]
    success: bool
    turns: int


def replay(env_spec: Any, seed: int, action_texts: list[str]) -> Replayed:
    """Re-run ``action_texts`` (the raw model outputs, one per turn) on task ``seed`` with a fresh
    episode from ``env_spec.make()``; stops at the first ``done``. Deterministic for VisGym (the
    maze depends only on the seed). Raises what the env raises on a bad seed."""
    ep = env_spec.make()
    ep.reset(int(seed))
    infos = []
    for text in action_texts:
        out = ep.step(text)
        infos.append(dict(out.info))
        if out.done:
            break
    return Replayed(seed=int(seed), infos=infos, success=bool(ep.success()), turns=len(infos))


def trajectory_image(env_spec: Any, seed: int, infos: list[dict[str, Any]], scale: float = 1.0) -> Image.Image | None:
    """The picture of one episode (see the module docstring for the drawer chosen), RGB, scaled by
    ``scale`` (nearest neighbour). None when the env offers no image at all."""
    own = getattr(env_spec, "render_trajectory", None)
    if callable(own):
        img = own(seed, infos)
    else:
        drawer = _drawer_for(env_spec)
        img = drawer(env_spec, seed, infos) if drawer else _first_image(env_spec, seed)
    if img is None:
        return None
    img = img.convert("RGB")
    if scale != 1.0:
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.NEAREST)
    return img


def _first_image(env_spec: Any, seed: int) -> Image.Image | None:
    obs = env_spec.make().reset(int(seed))
    return obs.images[0] if obs.images else None


# ------------------------------------------------------------------------------------ VisGym maze


def visgym_cells(variant: str, cell_size: int, seed: int, infos: list[dict[str, Any]]) -> tuple[list[tuple[int, int]], bool]:
    """Visited cells ``[(row, col), ...]`` (start first) and whether the agent stopped, replaying the
    executed actions of ``infos`` on ``envs.visgym.MazeEnv``."""
    from envs.visgym import MOVE_NAMES, STOP, MazeEnv

    env = MazeEnv(variant=variant, cell_size=cell_size)
    _, info = env.reset(seed=int(seed))
    cells = [tuple(info["agent"])]
    stopped = False
    for turn in infos:
        words = str(turn.get("action") or "").replace("move", " ").split()
        for w in words:
            a = STOP if w == "stop" else MOVE_NAMES.index(w) if w in MOVE_NAMES else None
            if a is None:
                continue
            _, _, terminated, _, info = env.step(a)
            if a == STOP:
                stopped = True
            elif tuple(info["agent"]) != cells[-1]:
                cells.append(tuple(info["agent"]))
            if terminated:
                return cells, stopped
    return cells, stopped


def draw_visgym(env_spec: Any, seed: int, infos: list[dict[str, Any]]) -> Image.Image:
    """VisGym maze_2d: the start image (agent on its start cell, as the policy first saw it) with the
    visited cells joined by an orange line, and the final cell marked: a green disc when the agent
    stopped on the goal, a black cross when it stopped elsewhere, a gray ring without a stop."""
    from envs.visgym import VARIANT_SIZES, generate_maze, render_image

    cs = int(env_spec.cell_size)
    maze_map, start, goal = generate_maze(int(seed), VARIANT_SIZES[env_spec.variant])
    img = render_image(maze_map, start, goal, cs).convert("RGB")
    cells, stopped = visgym_cells(env_spec.variant, cs, seed, infos)
    draw = ImageDraw.Draw(img)
    centre = [(c * cs + cs / 2 - 0.5, r * cs + cs / 2 - 0.5) for r, c in cells]
    if len(centre) > 1:
        draw.line(centre, fill=PATH_COLOUR, width=max(2, cs // 6), joint="curve")
        sx, sy = centre[0]
        r0 = cs / 4.0
        draw.ellipse([sx - r0, sy - r0, sx + r0, sy + r0], fill=(0, 0, 255))  # the start disc on top
    x, y = centre[-1]
    rad = cs * 0.38
    end = cells[-1]
    if stopped and end == tuple(goal):
        r1 = cs * 0.24
        draw.ellipse([x - r1, y - r1, x + r1, y + r1], fill=OK_COLOUR, outline=(255, 255, 255), width=max(1, cs // 12))
    elif stopped:
        w = max(2, cs // 8)
        draw.line([(x - rad, y - rad), (x + rad, y + rad)], fill=FAIL_COLOUR, width=w)
        draw.line([(x - rad, y + rad), (x + rad, y - rad)], fill=FAIL_COLOUR, width=w)
    else:
        draw.ellipse([x - rad, y - rad, x + rad, y + rad], outline=OPEN_COLOUR, width=max(2, cs // 10))
    return img


#: Built-in drawers by the env spec's class (module.qualname); env packages can instead define
#: ``render_trajectory`` on their spec.
DRAWERS: dict[str, Callable[[Any, int, list[dict[str, Any]]], Image.Image]] = {
    "envs.visgym.spec.VisGymMaze": draw_visgym,
}


def _drawer_for(env_spec: Any) -> Callable | None:
    for cls in type(env_spec).__mro__:
        fn = DRAWERS.get(f"{cls.__module__}.{cls.__qualname__}")
        if fn is not None:
            return fn
    return None


def strip(images: list[Image.Image], captions: list[str], pad: int = 8, caption_h: int = 18,
          background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Images side by side (top-aligned) with a caption line under each; RGB.

    Raises: ValueError when ``images`` is empty or the caption count differs.
    """
    if not images or len(images) != len(captions):
        raise ValueError(f"strip needs >= 1 image and one caption each, got {len(images)} / {len(captions)}")
    w = sum(i.width for i in images) + pad * (len(images) + 1)
    h = max(i.height for i in images) + caption_h + 2 * pad
    out = Image.new("RGB", (w, h), background)
    draw = ImageDraw.Draw(out)
    font = ImageFont.load_default(size=max(10, caption_h - 4))
    x = pad
    for img, cap in zip(images, captions):
        out.paste(img.convert("RGB"), (x, pad))
        draw.text((x, pad + img.height + 3), cap, fill=(0, 0, 0), font=font)
        x += img.width + pad
    return out


# ------------------------------------------------------------------------ the eval samples table

#: Columns of the ``eval/samples`` table the training loop logs at each evaluation.
SAMPLE_COLUMNS = ["seed", "path", "success", "reward", "turns", "outputs", "last_info"]


def sample_rows(env_spec: Any, reward_fn: Any, trajectories: list[Any]) -> list[list[Any]]:
    """Rows of the ``eval/samples`` table (``SAMPLE_COLUMNS``) for evaluation trajectories.

    path: ``trajectory_image`` of the episode (PIL image; None, with a warning in the log, if the
    drawing fails: a picture must not stop a training run). reward: the configured reward of the
    episode (``reward_fn(episode).total``). outputs: the model's raw outputs, turns joined by
    `` | ``. last_info: the env's info of the last turn, as JSON.
    """
    import json
    import logging

    rows = []
    for t in trajectories:
        ep = t.episode
        infos = [turn.info for turn in ep.turns]
        try:
            img = trajectory_image(env_spec, ep.seed, infos)
        except Exception as e:  # noqa: BLE001 - see docstring
            logging.getLogger(__name__).warning("eval/samples: no picture for seed %s: %s", ep.seed, e)
            img = None
        rows.append([
            int(ep.seed),
            img,
            bool(ep.success),
            float(reward_fn(ep).total),
            len(ep.turns),
            " | ".join(turn.action_text for turn in ep.turns),
            json.dumps(infos[-1], default=str) if infos else "",
        ])
    return rows
