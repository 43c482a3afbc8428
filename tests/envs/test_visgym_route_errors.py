"""envs/visgym/route_errors.py: the first error of a failed maze route, by kind, and its script."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envs.visgym.gym_env import STOP
from envs.visgym.maze import generate_maze, solve_moves, step_position
from envs.visgym.route_errors import first_route_error, needs_detour

ROOT = Path(__file__).resolve().parents[2]


def _maze(seed):
    maze_map, start, goal = generate_maze(seed, 9)
    return maze_map, start, solve_moves(maze_map, start, goal)


def _positions(maze_map, start, moves):
    pos, out = start, [start]
    for m in moves:
        pos = step_position(maze_map, pos, m)
        out.append(pos)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 7])
def test_each_kind_at_its_move(seed):
    maze_map, start, route = _maze(seed)
    cells = _positions(maze_map, start, route)
    # a wall: at the start corner, some direction is blocked (the border at least)
    blocked = next(d for d in range(4) if step_position(maze_map, start, d) == start)
    err = first_route_error("easy", seed, [blocked, *route, STOP])
    assert (err.kind, err.index, err.route_length) == ("wall", 0, len(route))
    # a wrong turn: the first cell on the route with an open neighbour that is not the next route cell
    for i, cell in enumerate(cells[:-1]):
        off = [d for d in range(4) if step_position(maze_map, cell, d) not in (cell, cells[i + 1])
               and (i == 0 or step_position(maze_map, cell, d) != cells[i - 1])]
        if off:
            err = first_route_error("easy", seed, [*route[:i], off[0], *route[i:], STOP])
            assert (err.kind, err.index) == ("wrong_turn", i)
            break
    else:
        pytest.fail(f"task {seed}: a 9x9 spanning-tree maze without a junction on its route")
    # on the route to the goal, then one more move instead of stop
    open_at_goal = next(d for d in range(4) if step_position(maze_map, cells[-1], d) != cells[-1])
    assert first_route_error("easy", seed, [*route, open_at_goal, STOP]).kind == "past_goal"
    # stopped three moves in, and a plan that ends without stop
    err = first_route_error("easy", seed, [*route[:3], STOP])
    assert (err.kind, err.index) == ("stopped_short", 3)
    assert first_route_error("easy", seed, route[:5]).index == 5


def test_a_solved_route_or_bad_input_is_an_error():
    _, _, route = _maze(3)
    with pytest.raises(ValueError, match="no error"):
        first_route_error("easy", 3, [*route, STOP])
    with pytest.raises(ValueError, match="0..4"):
        first_route_error("easy", 3, [9])
    with pytest.raises(ValueError, match="variant"):
        first_route_error("medium", 3, [0])


def test_script_tables_a_run(tmp_path):
    maze_map, start, route = _maze(5)
    words = ["right", "up", "left", "down"]
    blocked = next(d for d in range(4) if step_position(maze_map, start, d) == start)
    tasks = [
        {"seed": 5, "success": False, "actions": [f"<answer>{words[blocked]} stop</answer>"]},
        {"seed": 6, "success": False, "actions": ["I think left"]},  # not a plan: unparsed
        {"seed": 7, "success": True, "actions": ["<answer>stop</answer>"]},  # successes are skipped
    ]
    (tmp_path / "eval").mkdir()
    for name in ("final.json", "seen_final.json", "step_000010.json", "seen_step_000000.json", "step_000000.json"):
        (tmp_path / "eval" / name).write_text(json.dumps({"tasks": tasks}))
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "route_errors.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    # held-out evaluations first, in step order, then the trained-on tasks' (eval.seen_tasks) under their own line
    assert [ln.split()[0] for ln in out.splitlines()[1:]] == [
        "step_000000.json", "step_000010.json", "final.json", "trained-on", "seen_step_000000.json", "seen_final.json"]
    row = out.splitlines()[3].split()
    assert row[:2] == ["final.json", "2/3"]
    assert row[2:7] == ["1", "0", "0", "0", "1"]  # wall 1, wrong_turn 0, past_goal 0, stopped_short 0, unparsed 1
    detours = sum(needs_detour("easy", s) for s in (5, 6, 7))
    failed_detours = sum(needs_detour("easy", s) for s in (5, 6))
    assert row[-1] == f"{failed_detours}/{detours}"


def test_needs_detour_is_a_route_longer_than_manhattan():
    from envs.visgym.spec import EVAL_SETS

    seeds = EVAL_SETS["visgym_small_64"].seeds
    flags, lengths = [], []
    for s in seeds:
        maze_map, start, goal = generate_maze(s, 7)
        n = len(solve_moves(maze_map, start, goal))
        lengths.append(n)
        flags.append(needs_detour("small", s))
        # start and goal are opposite corners 4 cells apart each way: 8 moves without a detour
        assert flags[-1] == (n > 8)
    # the eval set's route lengths (conf/env/visgym_small.yaml: 58 x 8 moves, 5 x 12, 1 x 16)
    assert sorted(lengths).count(8) == 58 and sum(flags) == 6
    with pytest.raises(ValueError, match="variant"):
        needs_detour("medium", 3)


def test_script_names_a_missing_path(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "route_errors.py"), str(tmp_path / "nope")],
                         capture_output=True, text=True)
    assert res.returncode == 1
    assert "does not exist" in res.stderr and "Traceback" not in res.stderr


def test_script_takes_the_variant_of_a_copied_eval_json(tmp_path):
    """An eval json copied out of its run has no .hydra config: --variant names the maze size, and
    without it the script says which variant it assumed instead of silently reading 9x9 mazes."""
    from envs.visgym.spec import EVAL_SETS

    seeds = EVAL_SETS["visgym_small_64"].seeds
    # a 7x7 detour whose 9x9 maze of the same seed has none, so the two variants count differently
    picked = [s for s in seeds if needs_detour("small", s) and not needs_detour("easy", s)][:2]
    assert len(picked) == 2
    tasks = [{"seed": s, "success": False, "actions": ["<answer>stop</answer>"]} for s in picked]
    f = tmp_path / "final.json"
    f.write_text(json.dumps({"tasks": tasks}))
    script = str(ROOT / "scripts" / "route_errors.py")
    small = subprocess.run([sys.executable, script, str(f), "--variant", "small"],
                           capture_output=True, text=True, check=True)
    assert small.stdout.splitlines()[1].split()[-1] == "2/2"
    assert "assuming" not in small.stderr
    assumed = subprocess.run([sys.executable, script, str(f)], capture_output=True, text=True, check=True)
    assert "assuming variant 'easy'" in assumed.stderr and "--variant small" in assumed.stderr
    assert assumed.stdout.splitlines()[1].split()[-1] == "0/0"
    bad = subprocess.run([sys.executable, script, str(f), "--variant", "medium"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
