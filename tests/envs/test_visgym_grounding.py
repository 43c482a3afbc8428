"""The grounding questions' targets (envs/visgym/grounding.py), checked by hand and against the pixels."""

import numpy as np
import pytest

from envs.visgym.grounding import (
    GROUNDING_TASKS,
    cell_answer,
    grounding_example,
    open_moves,
    wall_bit_cells,
    walls_answer,
)
from envs.visgym.maze import generate_maze
from envs.visgym.render import AGENT_BLUE, GOAL_RED, WALL_GRAY, WHITE
from envs.visgym.spec import VisGymMaze

# Task seed 7 of maze_2d/easy, printed once and checked by eye (1 wall, 0 free):
SEED7 = np.array([
    [1, 1, 1, 1, 1, 1, 1, 1, 1],
    [1, 0, 0, 0, 0, 0, 0, 0, 1],
    [1, 0, 1, 0, 1, 1, 1, 0, 1],
    [1, 0, 1, 0, 0, 0, 1, 0, 1],
    [1, 0, 1, 0, 1, 1, 1, 1, 1],
    [1, 0, 1, 0, 0, 0, 1, 0, 1],
    [1, 1, 1, 0, 1, 1, 1, 0, 1],
    [1, 0, 0, 0, 0, 0, 0, 0, 1],
    [1, 1, 1, 1, 1, 1, 1, 1, 1],
])


def test_seed7_layout_is_the_hand_checked_one():
    maze_map, start, goal = generate_maze(7, 9)
    assert (maze_map == SEED7).all()
    assert (start, goal) == ((7, 1), (1, 7))


@pytest.mark.parametrize("cell, expected", [
    ((2, 2), "wall"), ((2, 3), "free"), ((3, 6), "wall"), ((4, 7), "wall"), ((6, 1), "wall"),
    ((6, 3), "free"), ((1, 4), "free"), ((5, 7), "free"),
    ((7, 1), "agent"), ((1, 7), "goal"),
])
def test_cell_answers_hand_checked(cell, expected):
    assert cell_answer(SEED7, (7, 1), (1, 7), cell) == expected


def test_walls_answer_hand_checked():
    """SEED7's 24 wall bits, read off the printed layout row by row: (1,2) (1,4) (1,6), (2,1) (2,3) ..."""
    text, offsets = walls_answer(SEED7)
    assert text == "a.b.c.d.e.f#g.h#i.j#k.l.m#n#o#p.q#r#s.t#u.v.w.x."
    assert offsets == tuple(range(1, 48, 2))
    assert wall_bit_cells(9)[:4] == [(1, 2), (1, 4), (1, 6), (2, 1)] and len(wall_bit_cells(9)) == 24


def test_walls_answer_on_a_hand_checked_7x7():
    maze = np.array([
        [1, 1, 1, 1, 1, 1, 1],
        [1, 0, 0, 0, 1, 0, 1],
        [1, 1, 1, 0, 1, 0, 1],
        [1, 0, 0, 0, 0, 0, 1],
        [1, 1, 1, 0, 1, 1, 1],
        [1, 0, 0, 0, 0, 0, 1],
        [1, 1, 1, 1, 1, 1, 1],
    ])  # task seed 5 of the small variant
    assert (generate_maze(5, 7)[0] == maze).all()
    # (1,2) (1,4) | (2,1) (2,3) (2,5) | (3,2) (3,4) | (4,1) (4,3) (4,5) | (5,2) (5,4)
    assert walls_answer(maze)[0] == "a.b#c#d.e.f.g.h#i.j#k.l."


def test_walls_refuses_a_maze_with_more_bits_than_labels():
    with pytest.raises(ValueError, match="labels at most 52"):
        walls_answer(np.ones((13, 13), dtype=int))


def test_agent_is_drawn_over_the_goal():
    assert cell_answer(SEED7, (1, 7), (1, 7), (1, 7)) == "agent"


@pytest.mark.parametrize("pos, expected", [
    ((3, 3), ["right", "up", "down"]),  # (3,2) is a wall
    ((5, 7), ["down"]),                 # a dead end
    ((1, 1), ["right", "down"]),        # a corner
    ((7, 4), ["right", "left"]),        # a corridor
])
def test_open_moves_hand_checked(pos, expected):
    assert open_moves(SEED7, pos) == expected


def _colour_at(image, cell, cell_size=25):
    """RGB at a cell's corner pixel (never under the agent disc)."""
    arr = np.asarray(image)
    return tuple(int(v) for v in arr[cell[0] * cell_size + 1, cell[1] * cell_size + 1])


def _blue_cell(image, cell_size=25):
    arr = np.asarray(image)
    ys, xs = np.nonzero((arr == np.array(AGENT_BLUE)).all(-1))
    return int(ys.mean()) // cell_size, int(xs.mean()) // cell_size


@pytest.mark.parametrize("task", GROUNDING_TASKS)
def test_answers_agree_with_the_rendered_image(task):
    """Each answer is what the picture shows: read back from the pixels, independently of the code."""
    rng = np.random.default_rng(0)
    colours = {"wall": WALL_GRAY, "free": WHITE, "goal": GOAL_RED}
    for seed in range(100, 140):
        ex = grounding_example(seed, task, rng)
        maze_map, _, _ = generate_maze(seed, 9)
        agent = _blue_cell(ex.image)
        arr = np.asarray(ex.image)
        reds = np.argwhere((arr == np.array(GOAL_RED)).all(-1))
        goal = (int(reds[0][0]) // 25, int(reds[0][1]) // 25)
        assert maze_map[agent] == 0 and maze_map[goal] == 0 and agent != goal
        if task == "cell":
            r, c = (int(v) for v in ex.question.removeprefix("What is in row ").rstrip("?").split(", column "))
            assert 1 <= r <= 7 and 1 <= c <= 7  # the border is never asked
            assert ex.wall_bit == ((r + c) % 2 == 1)
            if ex.answer == "agent":
                assert agent == (r, c)
            else:
                assert _colour_at(ex.image, (r, c)) == colours[ex.answer]
        elif task == "agent":
            assert ex.answer == f"row {agent[0]}, column {agent[1]}"
        elif task == "goal":
            assert ex.answer == f"row {goal[0]}, column {goal[1]}"
        elif task == "walls":
            values = [ex.answer[k] for k in ex.bit_offsets]
            assert len(values) == 24 and ex.answer[0::2] == "abcdefghijklmnopqrstuvwx"
            for value, cell in zip(values, wall_bit_cells(9)):
                seen = "." if cell in (agent, goal) else ("#" if _colour_at(ex.image, cell) == WALL_GRAY else ".")
                assert value == seen, (seed, cell)
        else:
            deltas = {"right": (0, 1), "up": (-1, 0), "left": (0, -1), "down": (1, 0)}
            want = [n for n, (dr, dc) in deltas.items()
                    if _colour_at(ex.image, (agent[0] + dr, agent[1] + dc)) != WALL_GRAY]
            assert ex.answer == (" ".join(want) or "none")


def test_agent_and_goal_positions_are_not_a_prior():
    """Agent and goal are drawn over free cells, not the env's start corners."""
    rng = np.random.default_rng(1)
    answers = {grounding_example(s, "agent", rng).answer for s in range(200, 260)}
    assert len(answers) > 20


def test_unknown_task_and_variant_are_refused():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="not one of"):
        grounding_example(1, "colour", rng)
    with pytest.raises(ValueError, match="variant"):
        grounding_example(1, "cell", rng, variant="huge")


def test_env_spec_offers_grounding_at_its_cell_size():
    spec = VisGymMaze(cell_size=8)
    ex = spec.grounding_example(3, "cell", np.random.default_rng(0))
    assert ex.image.size == (72, 72)
    assert set(spec.grounding_tasks) == set(GROUNDING_TASKS)
