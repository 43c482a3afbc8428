"""Route questions on text (envs/visgym/routes.py): each example's route is the shortest one through the maze its
notes describe, the kinds differ as documented, and no example has an evaluation maze's walls."""

import numpy as np
import pytest

from envs.visgym.maze import MOVE_DELTAS, MOVE_NAMES, distance_map
from envs.visgym.routes import ROUTE_KINDS, route_example
from envs.visgym.spec import VisGymMaze

SIZE = 7


def _map(ex):
    return np.frombuffer(ex.walls, dtype=np.uint8).reshape(SIZE, SIZE).astype(np.int64)


def _read_notes(notes):
    """The notes by hand: 12 labelled bits a-l, then 'r,c to r,c'."""
    walls, start, _, goal = notes.split(" ")
    assert [walls[k] for k in range(0, 24, 2)] == list("abcdefghijkl")
    bits = [walls[k] == "#" for k in range(1, 24, 2)]
    return bits, tuple(map(int, start.split(","))), tuple(map(int, goal.split(",")))


def test_every_route_is_the_shortest_through_the_maze_its_notes_describe():
    rng = np.random.default_rng(0)
    kinds, open_bits = {k: 0 for k in ROUTE_KINDS}, {k: set() for k in ROUTE_KINDS}
    for _ in range(300):
        ex = route_example(SIZE, rng, budget=17)
        maze_map = _map(ex)
        bits, start, goal = _read_notes(ex.notes)
        cells = [(r, c) for r in range(1, SIZE - 1) for c in range(1, SIZE - 1) if (r + c) % 2]
        assert bits == [bool(maze_map[r, c]) for r, c in cells]  # the notes are the map's wall bits in reading order
        assert ex.answer.startswith("<answer>") and ex.answer.endswith(" stop</answer>")
        words = ex.answer[len("<answer>"):-len(" stop</answer>")].split()
        pos = start
        for w in words:  # every move goes through an open cell
            dr, dc = MOVE_DELTAS[MOVE_NAMES.index(w)]
            pos = (pos[0] + dr, pos[1] + dc)
            assert maze_map[pos] == 0, (ex, pos)
        assert pos == goal and len(words) == distance_map(maze_map, goal)[start]  # there, and by a shortest route
        kinds[ex.kind] += 1
        open_bits[ex.kind].add(12 - sum(bits))
    assert min(kinds.values()) > 60  # drawn evenly
    assert open_bits["corner"] == open_bits["room"] == {8}  # trees over 9 rooms: 8 open passages
    assert len(open_bits["graph"]) >= 4 and max(open_bits["graph"]) > 8  # any pattern: loops too


def test_the_budget_and_the_holdout_are_kept_and_bad_kinds_refused():
    rng = np.random.default_rng(1)
    assert all(len(route_example(SIZE, rng, budget=5).answer.split()) <= 5 for _ in range(100))  # <= 4 moves + stop
    held = {route_example(SIZE, np.random.default_rng(s), kinds=("corner",)).walls for s in range(3)}
    assert not any(route_example(SIZE, rng, held, kinds=("corner",)).walls in held for _ in range(300))
    with pytest.raises(ValueError, match="route kinds must be some of"):
        route_example(SIZE, rng, kinds=("spiral",))
    with pytest.raises(ValueError, match="after 1000 tries"):
        route_example(SIZE, rng, budget=1)


@pytest.mark.parametrize("holdout", ["layout", "dihedral"])
def test_no_example_has_the_walls_of_an_evaluation_maze(holdout):
    env = VisGymMaze(variant="small", mode="plan", parser="plan_map", max_turns=17, holdout=holdout)
    keys = env.eval_set.twin_layouts() if holdout == "dihedral" else env.eval_set.layouts()
    held = {k[:-4] for k in keys}
    rng = np.random.default_rng(2)
    drawn = [env.route_example(rng) for _ in range(400)]
    assert not any(ex.walls in held for ex in drawn)
    # the holdout is not empty-handed: an unfiltered draw of corner tasks does hit those walls
    free = np.random.default_rng(2)
    assert any(route_example(SIZE, free, kinds=("corner",)).walls in held for _ in range(400))


def test_route_questions_need_plan_map():
    env = VisGymMaze(variant="small", mode="plan", parser="plan_walls", max_turns=17)
    with pytest.raises(ValueError, match="env.parser=plan_map"):
        env.route_example(np.random.default_rng(0))
