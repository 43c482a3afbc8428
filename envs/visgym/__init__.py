"""VisGym maze_2d for rlkit: upstream-identical mazes, a gymnasium env, the policy-facing episode
(interactive or single-turn plan mode), action parsers and the EnvSpec (backend=skyrl runs it through rlkit's
one skyrl-gym adapter over the env protocol, rlkit.backends.skyrl.env_adapter).

Public API:
    generate_maze(seed, size) -> (maze_map, start, goal)     maze.py
    solve(maze_map, start, goal) -> path; solve_moves(...) -> action directions
    render_image(maze_map, agent, goal, cell_size) -> PIL image; render_text(...) -> str
    MazeEnv (gymnasium; ids rlkit/Maze2D-easy-v0, rlkit/Maze2D-hard-v0, registered on import)
    make_parser(name) -> parser with parse(text) -> ParsedAction | None
    MazeEpisode (rlkit.types.EpisodeEnv), VisGymMaze (rlkit.types.EnvSpec, with render_trajectory
        for reports: picture.py), EVAL_SETS

What follows upstream VisGym exactly, how the tests check it, and the few deliberate differences:
envs/visgym/README.md.
"""

from envs.visgym.episode import MazeEpisode, system_prompt
from envs.visgym.gym_env import GYM_IDS, STOP, MazeEnv, register_gymnasium
from envs.visgym.maze import (
    MOVE_DELTAS,
    MOVE_NAMES,
    VARIANT_SIZES,
    dihedral_keys,
    distance_map,
    generate_maze,
    layout_key,
    path_to_moves,
    render_text,
    solve,
    solve_moves,
)
from envs.visgym.parsers import PARSER_NAMES, ParsedAction, make_parser
from envs.visgym.render import render_array, render_image
from envs.visgym.spec import EVAL_SETS, EvalSet, VisGymMaze

register_gymnasium()

__all__ = [
    "EVAL_SETS",
    "GYM_IDS",
    "MOVE_DELTAS",
    "MOVE_NAMES",
    "PARSER_NAMES",
    "STOP",
    "VARIANT_SIZES",
    "EvalSet",
    "MazeEnv",
    "MazeEpisode",
    "ParsedAction",
    "VisGymMaze",
    "dihedral_keys",
    "distance_map",
    "generate_maze",
    "layout_key",
    "make_parser",
    "path_to_moves",
    "register_gymnasium",
    "render_array",
    "render_image",
    "render_text",
    "solve",
    "solve_moves",
    "system_prompt",
]
