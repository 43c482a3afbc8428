"""Maze generation matches upstream VisGym maze_2d; the BFS solver and the eval-set budgets."""

from collections import Counter

import numpy as np
import pytest

from envs.visgym import (
    EVAL_SETS,
    MOVE_DELTAS,
    MOVE_NAMES,
    VARIANT_SIZES,
    dihedral_keys,
    generate_maze,
    layout_key,
    path_to_moves,
    render_text,
    solve,
    solve_moves,
)

from envs.visgym.maze import maze_key

SIZES = {"maze_2d/easy": 9, "maze_2d/hard": 11}


@pytest.mark.parametrize("env_id", sorted(SIZES))
def test_layouts_match_upstream_vectors(maze_vectors, env_id):
    records = maze_vectors[env_id]
    assert [r["seed"] for r in records] == list(range(8))
    for r in records:
        maze_map, start, goal = generate_maze(r["seed"], SIZES[env_id])
        assert maze_map.shape == (SIZES[env_id],) * 2
        assert maze_map.tolist() == r["maze_map"], f"{env_id} seed {r['seed']}: maze_map"
        assert list(start) == r["agent"], f"{env_id} seed {r['seed']}: start"
        assert list(goal) == r["target"], f"{env_id} seed {r['seed']}: goal"
        moves = solve_moves(maze_map, start, goal)
        assert len(moves) == r["shortest_moves"]
        assert moves == r["moves"]  # perfect maze: the shortest path is unique


@pytest.mark.parametrize("size", [7, 9, 11])
def test_maze_structure(size):
    for seed in range(20):
        maze_map, start, goal = generate_maze(seed, size)
        assert maze_map.dtype.kind == "i"
        assert set(np.unique(maze_map)) <= {0, 1}
        border = np.concatenate([maze_map[0], maze_map[-1], maze_map[:, 0], maze_map[:, -1]])
        assert border.all()
        assert maze_map[start] == 0 and maze_map[goal] == 0
        corners = {(1, 1), (size - 2, size - 2), (size - 2, 1), (1, size - 2)}
        assert start in corners and goal in corners
        # start and goal are opposite corners
        assert abs(start[0] - goal[0]) == abs(start[1] - goal[1]) == size - 3
        # a perfect maze on the inner grid: free cells form a tree (edges = nodes - 1)
        free = list(zip(*np.nonzero(maze_map == 0)))
        edges = sum(maze_map[r, c + 1] == 0 for r, c in free) + sum(maze_map[r + 1, c] == 0 for r, c in free)
        assert edges == len(free) - 1
    # deterministic
    a, b = generate_maze(123, size), generate_maze(123, size)
    assert np.array_equal(a[0], b[0]) and a[1:] == b[1:]


@pytest.mark.parametrize("size", [0, 5, 10, 13, -9])
def test_bad_size_raises(size):
    with pytest.raises(ValueError, match="9 .*or 11"):
        generate_maze(0, size)


def test_solver_path_and_errors():
    maze_map, start, goal = generate_maze(0, 9)
    path = solve(maze_map, start, goal)
    assert path[0] == start and path[-1] == goal
    for a, b in zip(path, path[1:]):
        assert maze_map[b] == 0 and (b[0] - a[0], b[1] - a[1]) in MOVE_DELTAS
    assert path_to_moves(path) == solve_moves(maze_map, start, goal)
    assert solve(maze_map, goal, goal) == [goal]
    with pytest.raises(ValueError, match="wall"):
        solve(maze_map, (0, 0), goal)
    blocked = maze_map.copy()
    blocked[goal] = 0
    r, c = goal
    blocked[r - 1 : r + 2, c - 1 : c + 2] = 1
    blocked[goal] = 0
    with pytest.raises(ValueError, match="not reachable"):
        solve(blocked, start, goal)
    with pytest.raises(ValueError, match="neighbours"):
        path_to_moves([(1, 1), (3, 1)])


def test_easy_eval_set_budgets():
    """All 64 easy eval mazes are solvable within 18 turns (moves + stop); 50 within 15."""
    eval_set = EVAL_SETS["visgym_easy_64"]
    assert eval_set.seeds == tuple(range(64)) and eval_set.variant == "easy"
    turns = [len(solve_moves(*generate_maze(s, 9))) + 1 for s in eval_set.seeds]
    assert Counter(t - 1 for t in turns) == {12: 50, 16: 14}
    assert sum(t <= 18 for t in turns) == 64
    assert sum(t <= 15 for t in turns) == 50


def test_small_eval_set_budgets():
    """All 64 small (7x7) eval mazes are solvable within 17 turns (moves + stop), as experiment=interactive_demo
    (and the plan budget of conf/env/visgym_small.yaml) needs: 58 need 9, 5 need 13, 1 needs 17."""
    eval_set = EVAL_SETS["visgym_small_64"]
    turns = [len(solve_moves(*generate_maze(s, 7))) + 1 for s in eval_set.seeds]
    assert Counter(turns) == {9: 58, 13: 5, 17: 1}


def test_hard_eval_set_budgets():
    turns = [len(solve_moves(*generate_maze(s, 11))) + 1 for s in EVAL_SETS["visgym_hard_64"].seeds]
    assert min(turns) == 17 and max(turns) == 33
    assert sum(t <= 30 for t in turns) == 63  # the VisGym paper's 30-turn budget on hard


def test_render_text():
    maze_map, start, goal = generate_maze(0, 9)
    text = render_text(maze_map, start, goal)
    lines = text.splitlines()
    assert len(lines) == 9 and all(len(line) == 9 for line in lines)
    assert lines[start[0]][start[1]] == "A" and lines[goal[0]][goal[1]] == "G"
    assert lines[0] == "#" * 9
    assert text.count("#") == int(maze_map.sum())
    assert render_text(maze_map, goal, goal).count("G") == 0  # agent drawn over the goal


def test_layout_key_names_the_maze():
    # same seed, same key; the key changes with the walls and with the corner pair
    assert layout_key(5, 9) == layout_key(5, 9)
    keys = {layout_key(s, 7) for s in range(3000)}
    # 7x7: a uniform spanning tree of the 3x3 node grid (192 trees) x 4 corner pairs = 768 layouts;
    # 3000 uniform draws meet 768 * (1 - exp(-3000/768)) = 753 of them on average
    assert len({k[:-4] for k in keys}) == 192 and 740 < len(keys) <= 768
    a, b = generate_maze(0, 7), generate_maze(1, 7)
    assert (layout_key(0, 7) == layout_key(1, 7)) == (np.array_equal(a[0], b[0]) and a[1:] == b[1:])


def test_small_variant_routes():
    # 7x7: opposite corners of a 3x3 node tree are 8 to 16 moves apart (4 to 8 node hops)
    lengths = Counter(len(solve_moves(*generate_maze(s, VARIANT_SIZES["small"]))) for s in range(300))
    assert set(lengths) <= {8, 12, 16} and lengths[8] > lengths[12] > lengths[16]


def test_dihedral_keys_turn_and_mirror_a_hand_checked_maze():
    # 7x7, start top-left, goal bottom-right; route right right right right down down down down
    maze_map = np.array([[1, 1, 1, 1, 1, 1, 1],
                         [1, 0, 0, 0, 0, 0, 1],
                         [1, 1, 1, 0, 1, 0, 1],
                         [1, 0, 0, 0, 1, 0, 1],
                         [1, 0, 1, 1, 1, 0, 1],
                         [1, 0, 0, 0, 1, 0, 1],
                         [1, 1, 1, 1, 1, 1, 1]])
    keys = dihedral_keys(maze_map, (1, 1), (5, 5))
    assert len(keys) == 8 and maze_key(maze_map, (1, 1), (5, 5)) in keys
    # turned a quarter counter-clockwise (np.rot90): the top row becomes the left column read upwards,
    # so the start (1, 1) moves to (5, 1) and the goal (5, 5) to (1, 5); the route turns with it
    turned = np.rot90(maze_map).copy()
    assert maze_key(turned, (5, 1), (1, 5)) in keys
    assert [MOVE_NAMES[m] for m in solve_moves(turned, (5, 1), (1, 5))] == ["up"] * 4 + ["right"] * 4
    # mirrored left-right: start (1, 5), goal (5, 1)
    assert maze_key(maze_map[:, ::-1].copy(), (1, 5), (5, 1)) in keys
    # not an image: the same walls with the endpoints swapped, or the walls transposed with the old endpoints
    assert maze_key(maze_map, (5, 5), (1, 1)) not in keys
    assert maze_key(maze_map.T.copy(), (5, 1), (1, 5)) not in keys
    # a ring symmetric under all 8, with endpoints fixed by the transpose only: 4 distinct images
    sym = np.ones((5, 5), dtype=np.int64)
    sym[1:4, 1:4], sym[2, 2] = 0, 1
    assert len(dihedral_keys(sym, (1, 1), (3, 3))) == 4
    with pytest.raises(ValueError, match="square"):
        dihedral_keys(np.ones((7, 9)), (1, 1), (5, 7))


@pytest.mark.parametrize("variant", ["small", "easy"])
def test_every_dihedral_image_of_an_eval_maze_is_a_maze_of_the_same_kind(variant):
    """An image of a corner-to-corner tree is one the generator can draw: corners, and a route of the same length."""
    size = VARIANT_SIZES[variant]
    for seed in EVAL_SETS[f"visgym_{variant}_64"].seeds[:16]:
        maze_map, start, goal = generate_maze(seed, size)
        length = len(solve_moves(maze_map, start, goal))
        for key in dihedral_keys(maze_map, start, goal):
            image = np.frombuffer(key[:-4], dtype=np.uint8).reshape(size, size).astype(np.int64)
            s, g = (key[-4], key[-3]), (key[-2], key[-1])
            assert {s, g} <= {(1, 1), (1, size - 2), (size - 2, 1), (size - 2, size - 2)}
            assert s[0] != g[0] and s[1] != g[1]
            assert int(image.sum()) == int(maze_map.sum())
            assert len(solve_moves(image, s, g)) == length
