"""Shapes: a second rlkit env, not a maze. A small picture of coloured shapes, a question only the picture
answers ("What colour is the circle?"), a one-word answer checked exactly (envs/shapes/env.py).

Public API:
    ShapesEnv (rlkit.types.EnvSpec; conf/env/shapes.yaml), ShapesEpisode (rlkit.types.EpisodeEnv)
    draw_task(seed, num_shapes, image_size) -> Task; render(task) -> PIL image      task.py
    parse_answer(text) -> (colour | None, reason); COLOURS, KINDS
"""

from envs.shapes.env import SYSTEM_PROMPT, ShapesEnv, ShapesEpisode, parse_answer
from envs.shapes.task import COLOURS, KINDS, Shape, Task, draw_task, render

__all__ = ["COLOURS", "KINDS", "SYSTEM_PROMPT", "Shape", "ShapesEnv", "ShapesEpisode", "Task", "draw_task",
           "parse_answer", "render"]
