"""Pictures of evaluation episodes, drawn by the env that ran them.

Used by the training loop's evaluation table (W&B ``eval/samples``) and by the run report's
trajectory strips. An env offers the picture of an episode through its spec, as it offers
observations (``rlkit.types.EnvSpec``): ``render_trajectory(seed, infos) -> PIL.Image`` (``infos``:
the per-turn ``StepOutput.info`` dicts of the episode, in order). An env spec without it gets the
episode's first observation image, re-created with ``env_spec.make().reset(seed)``. Nothing here
knows any particular env.

Episodes stored as text (``eval/<tag>.json``: seed + raw model outputs per turn) are replayed
through the env itself (``replay``) to get those infos back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from rlkit.types import SupportsTrajectoryRender


@dataclass
class Replayed:
    """An episode replayed from its seed and raw outputs: per-turn infos, success, turns used."""

    seed: int
    infos: list[dict[str, Any]]
    success: bool
    turns: int


def replay(env_spec: Any, seed: int, action_texts: list[str]) -> Replayed:
    """Re-run ``action_texts`` (the raw model outputs, one per turn) on task ``seed`` with a fresh
    episode from ``env_spec.make()``; stops at the first ``done``. Deterministic when the env's task
    depends only on the seed. Raises what the env raises on a bad seed."""
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
    """The picture of one episode: the env spec's ``render_trajectory(seed, infos)`` when it has
    one (rlkit.types.SupportsTrajectoryRender), else the episode's first observation image; RGB, scaled by
    ``scale`` (nearest neighbour). None when the env offers no image at all."""
    if isinstance(env_spec, SupportsTrajectoryRender):
        img = env_spec.render_trajectory(seed, infos)
    else:
        img = _first_image(env_spec, seed)
    if img is None:
        return None
    img = img.convert("RGB")
    if scale != 1.0:
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.NEAREST)
    return img


def _first_image(env_spec: Any, seed: int) -> Image.Image | None:
    obs = env_spec.make().reset(int(seed))
    return obs.images[0] if obs.images else None


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
