"""Route questions on text alone: ``plan_map``'s notes (the walls and both ends) -> the shortest route.

A ``plan_map`` policy (envs/visgym/parsers.py) writes what it reads in the picture as notes, then its route:
``a#b.c#d.e.f.g.h#i.j#k.l. 5,1 to 1,5<answer>right right up up ... stop</answer>``. Everything the route
depends on is in the notes, so the step from notes to route can be taught without pictures, on mazes no
training picture shows. That is the lever this module serves (``sft.route_mix``, rlkit/sft.py): on 7x7 the
tiny language model, trained on text alone, routes 89% of the 64 evaluation mazes when it learns from the
corner tasks of the other trees (the task shape of the default's training set), and 97% when it also
learns from random wall patterns and rooms (scripts/probe_text_routes.py, session 28).

Kinds of example (``ROUTE_KINDS``), each drawn with equal probability by ``route_example``:
    corner  a tree maze of the env's generator, corner to opposite corner (the evaluation's task shape);
    room    a tree maze, start and goal on two random rooms (rooms: the odd-odd cells);
    graph   any wall pattern (each wall bit open with probability p, p drawn from [0.5, 0.8] per maze; so
            mazes with loops, several routes and closed-off rooms), two random rooms joined by a route.
The route is the BFS solver's (``maze.solve_moves``): with loops several shortest routes exist, and the
solver's fixed move order picks one.

Held out: no example has the walls of a maze the caller holds out (the evaluation set's, or with a dihedral
holdout their turned and mirrored images), whatever its two ends: stricter than the picture tasks' layout
holdout, which trains on an evaluation maze's walls with other corners.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet

import numpy as np

from envs.visgym.grounding import walls_answer
from envs.visgym.maze import ROOM_TASKS, generate_maze, solve_moves
from envs.visgym.gym_env import STOP
from envs.visgym.parsers import make_parser, map_notes

ROUTE_KINDS: tuple[str, ...] = ("corner", "room", "graph")


@dataclass(frozen=True)
class RouteExample:
    """One route question: ``notes`` (what a ``plan_map`` policy writes before its route) and ``answer`` (the
    route it should write after them, ``<answer>... stop</answer>``); ``kind`` is one of ``ROUTE_KINDS``;
    ``walls`` the maze's map as bytes (uint8 [size, size] in row order), for holdout checks."""

    kind: str
    notes: str
    answer: str
    walls: bytes


def _rooms(size: int) -> list[tuple[int, int]]:
    return [(r, c) for r in range(1, size - 1, 2) for c in range(1, size - 1, 2)]


def _random_walls(size: int, rng: np.random.Generator) -> np.ndarray:
    maze_map = np.ones((size, size), dtype=np.int64)
    maze_map[1:-1:2, 1:-1:2] = 0  # the rooms
    p_open = rng.uniform(0.5, 0.8)
    for r in range(1, size - 1):
        for c in range(1, size - 1):
            if (r + c) % 2 == 1:
                maze_map[r, c] = 0 if rng.random() < p_open else 1
    return maze_map


def route_example(size: int, rng: np.random.Generator, held_out_walls: AbstractSet[bytes] = frozenset(),
                  budget: int | None = None, kinds: tuple[str, ...] = ROUTE_KINDS) -> RouteExample:
    """Draw one route question on a ``size`` x ``size`` maze (7, 9 or 11).

    Args:
        rng: draws the kind, the maze and its ends.
        held_out_walls: walls (``maze_map.astype(uint8).tobytes()``) no example may have.
        budget: the most actions incl. stop a route may take (the env's plan budget); longer ones are redrawn.
        kinds: the kinds to draw from, uniformly (``ROUTE_KINDS`` by default).

    Returns: a RouteExample whose ``notes + answer`` is exactly the ``plan_map`` demonstration of that maze.

    Raises:
        ValueError: an unknown kind or an empty ``kinds``, or 1000 draws in a row held out or too long (the
            holdout or the budget leaves nothing to draw).
    """
    unknown = [k for k in kinds if k not in ROUTE_KINDS]
    if unknown or not kinds:
        raise ValueError(f"route kinds must be some of {ROUTE_KINDS}, got {list(kinds)}")
    fmt = make_parser("plan_map")
    for _ in range(1000):
        kind = kinds[int(rng.integers(len(kinds)))]
        if kind == "graph":
            maze_map = _random_walls(size, rng)
            rooms = _rooms(size)
            i, j = rng.choice(len(rooms), size=2, replace=False)
            start, goal = rooms[int(i)], rooms[int(j)]
        else:
            seed = int(rng.integers(2**31))
            maze_map, start, goal = generate_maze(ROOM_TASKS + seed if kind == "room" else seed, size)
        walls = maze_map.astype(np.uint8).tobytes()
        if walls in held_out_walls:
            continue
        try:
            moves = solve_moves(maze_map, start, goal)
        except ValueError:  # a graph whose two rooms are not connected
            continue
        if budget is not None and len(moves) + 1 > budget:
            continue
        transcription = walls_answer(maze_map)[0]
        notes = map_notes(transcription, start, goal)
        text = fmt.format(moves + [STOP], walls=transcription, start=start, goal=goal)
        return RouteExample(kind, notes, text[len(notes):], walls)
    raise ValueError(f"no route question left to draw on {size}x{size} mazes after 1000 tries: the holdout "
                     f"({len(held_out_walls)} wall patterns) or the budget ({budget}) excludes them")
