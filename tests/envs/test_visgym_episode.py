"""The policy-facing episode (rlkit.types.EpisodeEnv) and the EnvSpec (VisGymMaze)."""

import json

import numpy as np
import pytest
from PIL import Image

from envs.visgym import EVAL_SETS, MazeEpisode, VisGymMaze, dihedral_keys, generate_maze, layout_key, solve_moves
from envs.visgym.upstream import upstream_installed
from rlkit.tasks import TaskSampler
from rlkit.types import EpisodeEnv, StepOutput

INFO_KEYS = {"parse_ok", "success", "agent", "goal", "distance", "bfs_distance", "feedback"}


def _run(spec: VisGymMaze, seed: int, texts: list[str]) -> tuple[MazeEpisode, list[StepOutput]]:
    env = spec.make()
    obs = env.reset(seed)
    assert len(obs.images) == 1 and isinstance(obs.images[0], Image.Image)
    outs = []
    for text in texts[: spec.max_turns]:
        out = env.step(text)
        outs.append(out)
        json.dumps(out.info)  # JSON-serialisable
        assert INFO_KEYS <= set(out.info)
        if out.done:
            break
    return env, outs


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(mode="interactive", parser="tuple"),
        dict(mode="interactive", parser="tuple_answer"),
        dict(mode="interactive", parser="keyword"),
        dict(mode="plan", parser="plan"),
        dict(mode="plan", parser="plan_walls"),
        dict(variant="small", mode="plan", parser="plan_walls", max_turns=17, wall_move="fail"),
        dict(variant="hard", mode="interactive", parser="tuple", max_turns=34),
        dict(variant="hard", mode="plan", parser="plan", max_turns=34),
    ],
)
def test_solver_episode_succeeds(kwargs):
    spec = VisGymMaze(**kwargs)
    assert isinstance(spec.make(), EpisodeEnv)
    for name in ("max_turns", "eval_set_name", "make", "eval_seeds", "is_eval_seed"):
        assert hasattr(spec, name), name  # rlkit.types.EnvSpec (not runtime-checkable)
    for seed in (0, 1, 63):
        env, outs = _run(spec, seed, spec.make().demonstration(seed))
        assert env.success() and outs[-1].done and outs[-1].reward == 1.0
        assert outs[-1].observation is None
        assert all(o.info["parse_ok"] for o in outs)
        assert outs[-1].info["success"] and not any(o.info["success"] for o in outs[:-1])
        assert len(outs) == (1 if spec.mode == "plan" else len(spec.solution(seed)))


def test_all_easy_eval_mazes_solved_within_18_turns():
    spec = VisGymMaze(mode="interactive", parser="tuple", max_turns=18)
    within_15 = 0
    for seed in spec.eval_seeds():
        env, outs = _run(spec, seed, spec.demonstration(seed))
        assert env.success(), f"seed {seed}"
        within_15 += len(outs) <= 15
    assert within_15 == 50


def test_interactive_unparsable_is_a_noop_with_feedback():
    spec = VisGymMaze(mode="interactive", parser="tuple")
    env = spec.make()
    first = env.reset(0)
    assert "1/18" in first.text
    assert "('move', d)" in env.system_prompt and "18 turns" in env.system_prompt
    out = env.step("I think I should go somewhere")
    assert not out.done and out.reward == 0.0
    assert out.info["parse_ok"] is False and out.info["success"] is False
    assert out.info["agent"] == [7, 1] and out.info["action"] is None
    assert "Could not read" in out.info["feedback"] and "Could not read" in out.observation.text
    assert "2/18" in out.observation.text
    assert np.array_equal(np.asarray(out.observation.images[0]), np.asarray(first.images[0]))
    out = env.step("('move', 3)")  # into the wall
    assert out.info["parse_ok"] and out.info["agent"] == [7, 1] and "Wall" in out.observation.text
    out = env.step("('move', 0)")
    assert out.info["agent"] == [7, 2] and out.info["action"] == "move right"
    assert out.observation.images[0].getpixel((2 * 25 + 12, 7 * 25 + 12)) == (0, 0, 255)
    out = env.step("('stop', 'stop')")  # off the goal: ends, no success
    assert out.done and out.reward == 0.0 and not env.success() and not out.info["success"]
    with pytest.raises(RuntimeError, match="done"):
        env.step("('move', 0)")


def test_reaching_goal_without_stop_is_not_success():
    spec = VisGymMaze(mode="interactive", parser="keyword")
    env, outs = _run(spec, 0, spec.demonstration(0)[:-1])
    assert not env.success() and not outs[-1].done and outs[-1].info["bfs_distance"] == 0
    assert sum(o.reward for o in outs) == 0.0


def test_plan_mode_variants():
    spec = VisGymMaze(mode="plan", parser="plan", max_turns=18)
    assert spec.max_turns == 1 and spec.action_budget == 18
    env = spec.make()
    assert "<answer>" in env.system_prompt and "18 steps" in env.system_prompt
    env.reset(0)
    out = env.step("no idea")
    assert out.done and out.info["parse_ok"] is False and not env.success()
    assert out.observation is None and "Could not read" in out.info["feedback"]
    # a plan without stop: moves executed, no success
    env.reset(0)
    demo = spec.demonstration(0)[0]
    out = env.step(demo.replace(" stop", ""))
    assert out.info["parse_ok"] and out.info["bfs_distance"] == 0 and not env.success()
    assert "without stop" in out.info["feedback"]
    # a plan longer than the budget is cut
    env.reset(0)
    out = env.step("<answer>" + "left " * 30 + "stop</answer>")
    assert out.info["actions_executed"] == 18 and out.info["plan_length"] == 31 and not env.success()
    # a plan that stops early ends there
    env.reset(0)
    out = env.step("<answer>right stop up up</answer>")
    assert out.info["actions_executed"] == 2 and out.info["agent"] == [7, 2] and not env.success()
    # a budget too small for the solution
    small = VisGymMaze(mode="plan", parser="plan", max_turns=5)
    env, outs = _run(small, 0, small.demonstration(0))
    assert not env.success() and outs[0].info["actions_executed"] == 5


def test_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="reset"):
        VisGymMaze().make().step("('move', 0)")


def test_episodes_are_independent_and_deterministic():
    spec = VisGymMaze(mode="interactive", parser="keyword")
    a, b = spec.make(), spec.make()
    oa, ob = a.reset(4), b.reset(4)
    assert np.array_equal(np.asarray(oa.images[0]), np.asarray(ob.images[0]))
    moved = None
    for word in ("up", "down", "left", "right"):
        out = a.step(f"<action>{word}</action>")
        if out.info["agent"] != list(generate_maze(4, 9)[1]):
            moved = out.info["agent"]
            break
    assert moved is not None
    assert b.step("<action>nothing</action>").info["agent"] == list(generate_maze(4, 9)[1])
    assert a.text().count("A") == 1 and b.text().count("G") == 1


def test_demonstration_formats():
    assert VisGymMaze(mode="interactive", parser="tuple").demonstration(0)[:2] == ["('move', 0)", "('move', 0)"]
    assert VisGymMaze(mode="interactive", parser="tuple").demonstration(0)[-1] == "('stop', 'stop')"
    assert VisGymMaze(mode="interactive", parser="keyword").demonstration(0)[-1] == "<action>stop</action>"
    plan = VisGymMaze(mode="plan", parser="plan").demonstration(0)
    assert plan == ["<answer>right right up up up up right right right right up up stop</answer>"]
    walls = VisGymMaze(mode="plan", parser="plan_walls").demonstration(0)
    # the same route after the 24 wall bits of task 0's 9x9 layout, read off its map by hand (rows 1-7:
    # the bits are the interior cells with row + col odd, labels a-x in reading order)
    maze_map, _, _ = generate_maze(0, 9)
    bits = [(r, c) for r in range(1, 8) for c in range(1, 8) if (r + c) % 2]
    by_hand = "".join(f"{chr(ord('a') + k)}{'#' if maze_map[r, c] else '.'}" for k, (r, c) in enumerate(bits))
    assert walls == [by_hand + plan[0]] and len(by_hand) == 48
    spec = VisGymMaze(variant="hard", mode="interactive", parser="tuple")
    maze_map, start, goal = generate_maze(7, 11)
    assert len(spec.demonstration(7)) == len(solve_moves(maze_map, start, goal)) + 1


def test_eval_sets_and_training_seeds():
    easy, hard = VisGymMaze(variant="easy"), VisGymMaze(variant="hard")
    assert easy.eval_set_name == "visgym_easy_64" and hard.eval_set_name == "visgym_hard_64"
    assert easy.eval_seeds() == list(range(64)) == hard.eval_seeds()
    assert easy.eval_set.version == 1 and EVAL_SETS["visgym_hard_64"].variant == "hard"
    assert all(easy.is_eval_seed(s) for s in range(64))
    assert not easy.is_eval_seed(64) and not easy.is_eval_seed(-1)
    stream = TaskSampler(0, easy.is_eval_seed).sample(500)
    assert stream == TaskSampler(0, easy.is_eval_seed).sample(500)
    assert stream != TaskSampler(1, easy.is_eval_seed).sample(500)
    assert not any(easy.is_eval_seed(s) for s in stream)


def test_training_never_draws_an_eval_maze_under_another_seed():
    # Seeds 1196347758 and 584998253 draw the same 9x9 mazes as eval seeds 40 and 20 (the default warm
    # start's task stream met them at steps 743 and 586 before layouts were compared).
    easy = VisGymMaze(variant="easy")
    for other, eval_seed in ((1196347758, 40), (584998253, 20)):
        assert layout_key(other, 9) == layout_key(eval_seed, 9)
        assert other not in easy.eval_set and easy.is_eval_seed(other)
    sampler = TaskSampler(0, easy.is_eval_seed)
    drawn = sampler.sample(200)
    assert not any(easy.is_eval_seed(s) for s in drawn)
    # 7x7 has 768 layouts: without the layout check about 1 in 12 training draws would be an eval maze
    small = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    eval_keys = {layout_key(s, 7) for s in small.eval_seeds()}
    assert len(eval_keys) == 64 == len(small.eval_seeds())
    raw = [s for s in range(64, 3000) if s not in small.eval_set]
    assert sum(layout_key(s, 7) in eval_keys for s in raw) > len(raw) / 20
    for seed in (0, 3):
        assert not any(layout_key(s, 7) in eval_keys for s in TaskSampler(seed, small.is_eval_seed).sample(1000))
    assert not small.is_eval_seed(-1) and small.is_eval_seed(small.eval_seeds()[-1])


def test_small_variant_is_native_only():
    with pytest.raises(ValueError, match="only in rlkit"):
        VisGymMaze(variant="small", mode="plan", parser="plan", impl="upstream")


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(cell_sise=25), TypeError, "cell_sise"),
        (dict(variant="medium"), ValueError, "variant"),
        (dict(mode="chat"), ValueError, "mode"),
        (dict(mode="plan", parser="tuple"), ValueError, "does not fit"),
        (dict(mode="interactive", parser="plan"), ValueError, "does not fit"),
        (dict(parser="json"), ValueError, "does not fit"),
        (dict(max_turns=0), ValueError, "max_turns"),
        (dict(max_turns=2.5), ValueError, "max_turns"),
        (dict(cell_size=3), ValueError, "cell_size"),
        (dict(impl="visgym"), ValueError, "impl"),
        (dict(holdout="orientation"), ValueError, "holdout"),
        (dict(impl="upstream", cell_size=10), ValueError, "cell_size"),
    ],
)
def test_spec_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        VisGymMaze(**kwargs)


def test_upstream_impl_without_the_fork_says_how_to_install():
    if upstream_installed():
        pytest.skip("VisGym's gymnasium fork is installed here")
    with pytest.raises(ImportError, match="pip install -e") as exc:
        VisGymMaze(impl="upstream")
    assert "impl=native" in str(exc.value) and "maze_2d/easy" in str(exc.value)


def test_wall_move_fail_ends_a_plan_at_its_first_bump():
    # 7x7 seed 0 (hand-checked):      #######
    #                                  #...#G#   start A (5, 1), goal G (1, 5),
    #                                  #.###.#   shortest route: right right up up right right up up
    #                                  #.....#
    #                                  ###.###
    #                                  #A....#
    #                                  #######
    route = "right right up up right right up up"
    padded = f"<answer>{route} right right stop</answer>"  # two bumps into the border on the goal
    detour = "<answer>right right up up left left right right right right up up stop</answer>"  # dead end and back
    lenient = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    strict = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17, wall_move="fail")
    assert lenient.wall_move == "stay" and "wall_move='fail'" in repr(strict)
    env = lenient.make()
    env.reset(0)
    out = env.step(padded)
    assert env.success() and out.info["hit_wall"] is False and out.info["actions_executed"] == 11
    env = strict.make()
    env.reset(0)
    out = env.step(padded)
    assert out.done and not env.success() and out.reward == 0.0
    assert out.info["hit_wall"] is True and out.info["actions_executed"] == 9 and out.info["agent"] == [1, 5]
    assert "hit a wall" in out.info["feedback"] and out.info["action"] == route + " right"
    for text in (f"<answer>{route} stop</answer>", detour):
        env.reset(0)
        out = env.step(text)
        assert env.success() and out.info["hit_wall"] is False, text
    # a bump in the middle of an otherwise right route
    env.reset(0)
    out = env.step("<answer>up right right up up right right up up stop</answer>")
    assert not env.success() and out.info["actions_executed"] == 1 and out.info["agent"] == [5, 1]


def test_wall_move_fail_ends_an_interactive_episode():
    spec = VisGymMaze(variant="small", mode="interactive", parser="keyword", max_turns=17, wall_move="fail")
    env = spec.make()
    env.reset(0)
    out = env.step("<action>right</action>")
    assert not out.done and out.info["agent"] == [5, 2]
    out = env.step("<action>down</action>")  # row 6 is the border
    assert out.done and out.observation is None and not env.success() and out.info["hit_wall"] is True
    assert "hit a wall" in out.info["feedback"]
    with pytest.raises(ValueError, match="wall_move"):
        VisGymMaze(variant="small", wall_move="bounce")


def test_the_dihedral_holdout_keeps_turned_and_mirrored_eval_mazes_out_of_training():
    layout = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17)
    dihedral = VisGymMaze(variant="small", mode="plan", parser="plan", max_turns=17, holdout="dihedral")
    eval_keys = {layout_key(s, 7) for s in layout.eval_seeds()}
    twin_keys = set().union(*(dihedral_keys(*generate_maze(s, 7)) for s in layout.eval_seeds()))
    # the first seeds of each kind in the stream of all 7x7 seeds
    seeds = [s for s in range(64, 2000) if s not in layout.eval_set]
    twins = [s for s in seeds if layout_key(s, 7) in twin_keys - eval_keys]
    others = [s for s in seeds if layout_key(s, 7) not in twin_keys]
    assert twins and others
    assert not any(layout.is_eval_seed(s) for s in twins[:50]) and all(dihedral.is_eval_seed(s) for s in twins[:50])
    assert not any(dihedral.is_eval_seed(s) for s in others[:50])
    assert all(dihedral.is_eval_seed(s) for s in dihedral.eval_seeds())
    drawn = TaskSampler(0, dihedral.is_eval_seed).sample(5000)  # covers all 360 (coupon collector)
    assert not any(layout_key(s, 7) in twin_keys for s in drawn)
    # 7x7: the 64 eval mazes have 344 twins among the 704 other layouts, which leaves 360 to train on
    assert len({layout_key(s, 7) for s in drawn}) == 360 and len(twin_keys - eval_keys) == 344
    assert "holdout='dihedral'" in repr(dihedral) and "holdout" not in repr(layout)


def test_twin_seeds_draw_the_turned_and_mirrored_images_of_each_eval_maze():
    small = EVAL_SETS["visgym_small_64"]
    by_eval = small.twin_seeds(6000)
    assert sorted(by_eval) == sorted(small.seeds)
    assert len({t for tw in by_eval.values() for t in tw}) == 344  # every twin, the first seed drawing it
    for s, tw in by_eval.items():
        images = dihedral_keys(*generate_maze(s, 7))
        assert tw and all(layout_key(t, 7) in images and t not in small for t in tw)
        assert len({layout_key(t, 7) for t in tw}) == len(tw)
        assert len(tw) == len(images - set(small.layouts()))
    assert small.twin_seeds(1) == {s: [] for s in small.seeds}
    with pytest.raises(ValueError, match="seed_limit"):
        small.twin_seeds(0)


@pytest.mark.parametrize("wall_move", ["stay", "fail"])
@pytest.mark.parametrize("parser", ["tuple", "keyword"])
def test_recovery_demonstrations_make_one_mistake_and_solve_from_where_it_leads(wall_move, parser):
    """sft.recovery_share's data: one turn not imitated (a move off the solver's route), then the solver's way from
    the cell it leads to; replayed, the episode succeeds. Under "stay" both kinds of mistake are drawn (into a wall:
    the agent stays and the same route follows; into a side corridor: the way back), under "fail" never a wall."""
    from envs.visgym.maze import step_position

    spec = VisGymMaze(variant="small", mode="interactive", parser=parser, max_turns=40, wall_move=wall_move)
    rng = np.random.default_rng(5)
    kinds = set()
    for seed in range(40):
        turns = spec.recovery_demonstration(seed, rng)
        texts, imitate = [t for t, _ in turns], [i for _, i in turns]
        maze_map, start, goal = generate_maze(seed, 7)
        route = solve_moves(maze_map, start, goal)
        assert imitate.count(False) == 1
        k = imitate.index(False)
        assert texts[:k] == spec.demonstration(seed)[:k]  # the solver's route up to the mistake
        env, outs = _run(spec, seed, texts)
        assert env.success() and len(outs) == len(texts)
        assert not any(o.info["hit_wall"] for o in outs)  # "fail" never draws a wall; "stay" reports none
        here = tuple(outs[k - 1].info["agent"]) if k else start
        after = tuple(outs[k].info["agent"])
        assert _move_of(texts[k], parser) != route[k]  # a move the solver does not make here
        assert after == step_position(maze_map, here, _move_of(texts[k], parser))
        rest = solve_moves(maze_map, after, goal)
        assert len(texts) == k + 1 + len(rest) + 1  # then the shortest way on from there, and stop
        kinds.add("wall" if after == here else "corridor")
    assert kinds == ({"wall", "corridor"} if wall_move == "stay" else {"corridor"})
    # the same generator state draws the same demonstrations
    again = [spec.recovery_demonstration(3, np.random.default_rng(1)) for _ in range(2)]
    assert again[0] == again[1]


def _move_of(text: str, parser: str) -> int:
    from envs.visgym.parsers import make_parser

    return make_parser(parser).parse_with_reason(text)[0].actions[0]


def test_recovery_demonstrations_need_interactive_mode():
    with pytest.raises(ValueError, match="env.mode=interactive"):
        VisGymMaze(mode="plan", parser="plan").recovery_demonstration(0, np.random.default_rng(0))
