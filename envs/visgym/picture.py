"""The picture of a VisGym maze episode, offered to reports through ``VisGymMaze.render_trajectory``.

The start image (agent on its start cell, as the policy first saw it) with the visited cells joined
by an orange line, and the final cell marked: a green disc when the agent stopped on the goal, a
black cross when it stopped elsewhere, a gray ring without a stop. The path is what the env
executed: the per-turn info ``action`` (interactive: ``"move right"`` / ``"stop"`` / None for an
unparsable turn; plan mode: the executed route words, ``"right right down stop"``; see episode.py)
replayed on ``MazeEnv``, so moves into walls leave the agent in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from envs.visgym.gym_env import STOP, MazeEnv
from envs.visgym.maze import MOVE_NAMES, VARIANT_SIZES, generate_maze
from envs.visgym.render import AGENT_BLUE, agent_disc_mask, render_array

PATH_COLOUR = (255, 140, 0)  # orange polyline through the visited cells
OK_COLOUR = (0, 170, 0)  # disc on the final cell: stopped on the goal
FAIL_COLOUR = (0, 0, 0)  # cross on the final cell: stopped off the goal
OPEN_COLOUR = (110, 110, 110)  # ring on the final cell: no stop (budget or parse failures)


def episode_cells(variant: str, cell_size: int, seed: int, infos: list[dict[str, Any]]) -> tuple[list[tuple[int, int]], bool]:
    """Visited cells ``[(row, col), ...]`` (start first, a cell again only after moving) and whether
    the agent stopped, replaying the executed actions of ``infos`` (per-turn ``StepOutput.info``)."""
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


def draw_episode(variant: str, cell_size: int, seed: int, infos: list[dict[str, Any]]) -> Image.Image:
    """RGB picture of one episode (see the module docstring), the maze's size in pixels."""
    cs = int(cell_size)
    maze_map, start, goal = generate_maze(int(seed), VARIANT_SIZES[variant])
    img = Image.fromarray(render_array(maze_map, start, goal, cs))
    cells, stopped = episode_cells(variant, cs, seed, infos)
    draw = ImageDraw.Draw(img)
    centre = [(c * cs + cs / 2 - 0.5, r * cs + cs / 2 - 0.5) for r, c in cells]
    if len(centre) > 1:
        draw.line(centre, fill=PATH_COLOUR, width=max(2, cs // 6), joint="curve")
        arr = np.array(img)  # the start disc back on top of the line, as the env draws it
        r0, c0 = start[0] * cs, start[1] * cs
        arr[r0 : r0 + cs, c0 : c0 + cs][agent_disc_mask(cs)] = AGENT_BLUE
        img = Image.fromarray(arr)
        draw = ImageDraw.Draw(img)
    x, y = centre[-1]
    rad = cs * 0.38
    if stopped and cells[-1] == tuple(goal):
        r1 = cs * 0.24
        draw.ellipse([x - r1, y - r1, x + r1, y + r1], fill=OK_COLOUR, outline=(255, 255, 255), width=max(1, cs // 12))
    elif stopped:
        w = max(2, cs // 8)
        draw.line([(x - rad, y - rad), (x + rad, y + rad)], fill=FAIL_COLOUR, width=w)
        draw.line([(x - rad, y + rad), (x + rad, y - rad)], fill=FAIL_COLOUR, width=w)
    else:
        draw.ellipse([x - rad, y - rad, x + rad, y + rad], outline=OPEN_COLOUR, width=max(2, cs // 10))
    return img
