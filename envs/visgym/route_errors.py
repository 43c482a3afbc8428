"""Where a policy's route goes wrong: the first error of each failed maze episode, by kind.

A VisGym maze is a spanning tree (envs.visgym.maze), so the route from start to goal is unique and every
move either follows it or leaves it. For a failed episode the first move off that route is one of:

- ``wall``: a move into a wall (the agent stays in place): the picture was misread at that cell;
- ``wrong_turn``: a move into an open cell off the route (a dead-end corridor): a planning error, the
  corridor is really there but does not lead to the goal;
- ``past_goal``: the agent reached the goal and moved on instead of stopping;
- ``stopped_short``: the route stopped (or ended, or ran out of budget) before the goal, every move so far
  on the route.

Used by ``scripts/route_errors.py`` on a run's ``eval/*.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from envs.visgym.gym_env import STOP
from envs.visgym.maze import VARIANT_SIZES, generate_maze, solve_moves, step_position

ERROR_KINDS: tuple[str, ...] = ("wall", "wrong_turn", "past_goal", "stopped_short")


@dataclass(frozen=True)
class RouteError:
    """The first error of a failed episode.

    kind: one of ``ERROR_KINDS``. index: 0-based position of that action in the episode's actions (for
    ``stopped_short``: the number of moves made). route_length: moves on the shortest route (stop excluded).
    """

    kind: str
    index: int
    route_length: int


def needs_detour(variant: str, seed: int) -> bool:
    """True when task ``seed``'s route (unique: the maze is a spanning tree) is longer than the Manhattan
    distance from start to goal, so it must somewhere move away from the goal. In rlkit's 7x7 variant 6 of
    the 64 mazes of visgym_small_64 need one (routes of 12 and 16 moves; the other 58 take 8), and a
    policy that only walks towards the goal fails exactly those.

    Raises:
        ValueError: unknown variant.
    """
    if variant not in VARIANT_SIZES:
        raise ValueError(f"variant must be one of {sorted(VARIANT_SIZES)}, got {variant!r}")
    maze_map, start, goal = generate_maze(seed, VARIANT_SIZES[variant])
    return len(solve_moves(maze_map, start, goal)) > abs(start[0] - goal[0]) + abs(start[1] - goal[1])


def first_route_error(variant: str, seed: int, actions: Sequence[int]) -> RouteError:
    """Classify the first error of ``actions`` (``Discrete(5)`` indices: 0 right, 1 up, 2 left, 3 down,
    4 stop) on VisGym task ``seed`` of ``variant`` ("easy" 9x9, "hard" 11x11).

    Call it for failed episodes; a route that follows the shortest path and stops on the goal has no
    error. Actions after the first error are not looked at.

    Raises:
        ValueError: unknown variant, an action outside 0..4, or a route without an error.
    """
    if variant not in VARIANT_SIZES:
        raise ValueError(f"variant must be one of {sorted(VARIANT_SIZES)}, got {variant!r}")
    maze_map, pos, goal = generate_maze(seed, VARIANT_SIZES[variant])
    route = solve_moves(maze_map, pos, goal)
    for i, a in enumerate(actions):
        if a not in (0, 1, 2, 3, STOP):
            raise ValueError(f"actions are Discrete(5) indices 0..4, got {a!r} at position {i}")
        if a == STOP:
            if i == len(route):
                raise ValueError(f"task {seed}: the route follows the shortest path and stops on the goal; no error")
            return RouteError("stopped_short", i, len(route))
        if i == len(route):
            return RouteError("past_goal", i, len(route))
        if a != route[i]:
            kind = "wall" if step_position(maze_map, pos, a) == pos else "wrong_turn"
            return RouteError(kind, i, len(route))
        pos = step_position(maze_map, pos, a)
    return RouteError("stopped_short", len(actions), len(route))
