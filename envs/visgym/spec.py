"""``VisGymMaze``: the EnvSpec that conf/env/visgym*.yaml instantiates, and the fixed eval sets.

Evaluation sets are named, versioned objects: ``visgym_easy_64`` (maze_2d/easy seeds 0..63, the
upstream VisGym evaluation set), ``visgym_hard_64`` (maze_2d/hard seeds 0..63) and ``visgym_small_64``
(rlkit's 7x7 variant: the first 64 seeds with pairwise distinct layouts). Training must never see
them: ``is_eval_seed`` says which seeds to skip and ``train_seed_stream`` yields a seeded stream of
training seeds that already skips them. Both compare layouts (walls, start and goal;
``maze.layout_key``), not only seed numbers: another seed can draw an evaluation maze again (a 9x9
warm start of 25,600 mazes drew eval mazes 40 and 20 before this check; 7x7 has only 768 layouts).

Step budgets on the eval sets (shortest path + 1 stop): easy needs 13 turns (50 mazes) or 17 turns
(14 mazes), so 15 turns admit 50/64 and 18 turns all 64; hard needs 17 to 33 turns (30 turns,
the VisGym paper's budget, admit 63/64). Reports state the budget next to the success rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
from PIL import Image

from envs.visgym.episode import MODE_PARSERS, MODES, WALL_MOVES, MazeEpisode, demonstration_texts, solution_actions

#: Parsers that read the content of an ``<answer>...</answer>`` block (the others read the whole text, as upstream).
ANSWER_BLOCK_PARSERS: tuple[str, ...] = ("plan", "plan_cells", "plan_walls", "plan_map", "tuple_answer")
from envs.visgym.gym_env import MazeEnv
from envs.visgym.maze import LOOP_TASKS, ROOM_TASKS, VARIANT_SIZES, dihedral_keys, generate_maze, layout_key, maze_key
from envs.visgym.grounding import GROUNDING_TASKS, GroundingExample, grounding_example
from envs.visgym.picture import draw_episode
from envs.visgym.routes import RouteExample, route_example
from envs.visgym.render import DEFAULT_CELL_SIZE
from envs.visgym.upstream import UPSTREAM_VARIANTS, UpstreamMazeEnv, require_upstream

IMPLS = ("native", "upstream")

#: What training keeps out (``VisGymMaze(holdout=...)``): the evaluation mazes, or also their dihedral images.
HOLDOUTS = ("layout", "dihedral")

#: Where a ``plan_map`` route is written (``VisGymMaze(route_context=...)``): after the notes in the picture's
#: context, or in a second context of text alone (rlkit.rollout's route pass).
ROUTE_CONTEXTS = ("picture", "text")

#: The text that ends the notes and opens the route in ``plan_map``'s answer: the first pass stops at it.
ROUTE_OPENING = "<answer>"


@dataclass(frozen=True)
class EvalSet:
    """A fixed evaluation set: ``name`` (for logs and result files), ``version``, the maze
    ``variant`` and its task ``seeds``. A change of content must bump the version.

    ``seed in eval_set`` is membership by seed number; ``eval_set.holds_layout_of(seed)`` also
    catches a different seed that draws one of the set's mazes (what training must skip), and with
    ``dihedral=True`` one that draws a turned or mirrored image of one (``maze.dihedral_keys``)."""

    name: str
    version: int
    variant: str
    seeds: tuple[int, ...]
    _seed_set: frozenset = field(init=False, repr=False, compare=False)
    _layouts: dict = field(init=False, repr=False, compare=False)
    _twins: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_seed_set", frozenset(self.seeds))
        object.__setattr__(self, "_layouts", {})  # filled on first use: {layout_key: eval seed}
        object.__setattr__(self, "_twins", {})  # filled on first use: {key of a dihedral image: eval seed}

    def __contains__(self, seed: object) -> bool:
        return seed in self._seed_set

    def layouts(self) -> dict[bytes, int]:
        """``{layout_key: seed}`` of the set's mazes (computed once; a layout key costs ~0.1 ms, so the
        check adds ~3 ms to a 32-maze warm-start step)."""
        if not self._layouts:
            size = VARIANT_SIZES[self.variant]
            self._layouts.update({layout_key(s, size): s for s in self.seeds})
        return self._layouts

    def twin_layouts(self) -> dict[bytes, int]:
        """``{key: seed}`` of every turned or mirrored image of the set's mazes, their own keys included
        (``maze.dihedral_keys``; computed once: 7x7's 64 mazes have 408 images, 9x9's 64 have 512)."""
        if not self._twins:
            size = VARIANT_SIZES[self.variant]
            for s in self.seeds:
                self._twins.update(dict.fromkeys(dihedral_keys(*generate_maze(s, size)), s))
        return self._twins

    def holds_layout_of(self, seed: int, dihedral: bool = False) -> bool:
        """True if task ``seed`` is one of the set's seeds or draws the same maze as one of them, or with
        ``dihedral`` a turned or mirrored image of one (a negative or non-integer seed draws no maze: only its
        number is compared)."""
        if seed in self._seed_set:
            return True
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            return False
        keys = self.twin_layouts() if dihedral else self.layouts()
        if seed >= LOOP_TASKS:
            return self._holds_tree_of_loop(int(seed), keys)
        return layout_key(int(seed), VARIANT_SIZES[self.variant]) in keys

    def twin_seeds(self, seed_limit: int) -> dict[int, list[int]]:
        """Task seeds below ``seed_limit`` that draw a turned or mirrored image of one of the set's mazes (not
        one of the set's own mazes), the first seed of each such maze: ``{eval seed: [seeds]}``, every eval seed
        a key. 7x7: all 344 twins are drawn by seeds below 5,400; 9x9 has 448, and about one seed in 900 draws one.

        Raises:
            ValueError: ``seed_limit`` < 1.
        """
        if seed_limit < 1:
            raise ValueError(f"seed_limit must be >= 1, got {seed_limit!r}")
        size, twins, own = VARIANT_SIZES[self.variant], self.twin_layouts(), self.layouts()
        first: dict[bytes, int] = {}  # twin key -> the first seed that draws it
        for seed in range(seed_limit):
            key = layout_key(seed, size)
            if key in twins and key not in own:
                first.setdefault(key, seed)
        # each evaluation maze gets the seeds of its own images (two evaluation mazes may be twins of each other)
        return {s: sorted(first[k] for k in dihedral_keys(*generate_maze(s, size)) if k in first) for s in self.seeds}

    def _holds_tree_of_loop(self, seed: int, layouts: dict[bytes, int]) -> bool:
        """A loop task (``maze.LOOP_TASKS``) is held out when closing one of its passages again gives one of
        ``layouts`` (the set's mazes, or their dihedral images): its picture differs from one by one passage."""
        maze_map, start, goal = generate_maze(seed, VARIANT_SIZES[self.variant])
        size = maze_map.shape[0]
        for r in range(1, size - 1):
            for c in range(1, size - 1):
                if (r + c) % 2 == 1 and maze_map[r, c] == 0:
                    maze_map[r, c] = 1
                    if maze_key(maze_map, start, goal) in layouts:
                        return True
                    maze_map[r, c] = 0
        return False


def first_distinct_layouts(variant: str, n: int) -> tuple[int, ...]:
    """The first ``n`` seeds from 0 up whose layouts are pairwise distinct (a fixed eval set for a
    variant with few layouts)."""
    size, seen, out = VARIANT_SIZES[variant], set(), []
    s = 0
    while len(out) < n:
        k = layout_key(s, size)
        if k not in seen:
            seen.add(k)
            out.append(s)
        s += 1
    return tuple(out)


EVAL_SETS: dict[str, EvalSet] = {
    "visgym_easy_64": EvalSet("visgym_easy_64", 1, "easy", tuple(range(64))),
    "visgym_hard_64": EvalSet("visgym_hard_64", 1, "hard", tuple(range(64))),
    "visgym_small_64": EvalSet("visgym_small_64", 1, "small", first_distinct_layouts("small", 64)),
}

_EVAL_SET_OF_VARIANT = {"easy": "visgym_easy_64", "hard": "visgym_hard_64", "small": "visgym_small_64"}


def train_seed_stream(seed: int, eval_set: EvalSet, to_task: Callable[[int], int] | None = None,
                      dihedral: bool = False) -> Iterator[int]:
    """Endless stream of training task seeds, reproducible from ``seed``: seeds in [0, 2**31 - 1), each
    mapped by ``to_task`` if given (``VisGymMaze.training_task``), skipping the seeds of ``eval_set`` and
    every seed that draws one of its mazes (with ``dihedral``: or a turned or mirrored image of one)."""
    rng = np.random.default_rng(seed)
    while True:
        s = int(rng.integers(0, 2**31 - 1))
        if to_task is not None:
            s = to_task(s)
        if not eval_set.holds_layout_of(s, dihedral):
            yield s


class VisGymMaze:
    """EnvSpec for VisGym maze_2d (``rlkit.types.EnvSpec``); every argument is a config key.

    Args:
        variant: "easy" (9x9, maze_2d/easy), "hard" (11x11, maze_2d/hard) or "small" (7x7, rlkit's own:
            the same generator, routes of 8-16 moves; native impl only).
        mode: "interactive" (one action per turn) or "plan" (one turn, whole route).
        max_turns: interactive: policy turns per episode (default 18: admits all 64 easy eval
            mazes). plan: the action budget of the single plan (stop included); the policy gets
            ``self.max_turns == 1`` turn.
        parser: action format; interactive: "tuple" (VisGym, upstream-exact), "tuple_answer",
            "tuple_lenient", "keyword" (SkyRL);
            plan: "plan", "plan_cells", "plan_walls", "plan_map" (envs/visgym/parsers.py).
        cell_size: pixels per maze cell in the image (25 as upstream: 225x225 easy, 275x275 hard).
        impl: "native" (``MazeEnv``, this package) or "upstream" (the VisGym fork, must be installed).
        wall_move: what a move into a wall does: "stay" (upstream VisGym: the agent stays in place)
            or "fail" (the episode ends there, unsuccessful). rlkit's plan-mode configs use "fail": with
            "stay" a plan can pad its route with moves that are free when they hit a wall, and GRPO
            learns that padding instead of routes (envs/visgym/episode.py WALL_MOVES).
        train_room_endpoints: the share of training tasks (SFT demonstrations and GRPO tasks; 0.0 to 1.0)
            whose start and goal are two distinct rooms drawn at random instead of two opposite corners
            (``maze.ROOM_TASKS``). The evaluation set stays corner-to-corner. 7x7 has 768 corner layouts
            only, so a policy trained on them can fit the layouts it sees; with room endpoints it cannot
            tell the route from which corner it starts in. Which stream seeds become room tasks is fixed
            by the seed (``training_task``).
        train_open_passage: the share of training tasks (0.0 to 1.0, at most 1 - train_room_endpoints) that are
            loop tasks (``maze.LOOP_TASKS``): the corner task with one more passage opened, so the maze has a
            loop and its shortest route may take the new passage. 7x7 has 768 tree layouts (704 to train on),
            and the held-out ones differ from trained-on ones by one moved passage; loop tasks add 4 per tree
            whose route turns on one passage. A loop task that closes back to an evaluation maze is skipped
            (``EvalSet.holds_layout_of``).
        holdout: what training keeps out besides the evaluation mazes themselves: "layout" (every seed that
            draws one of them) or "dihedral" (also every maze that is one of them turned or mirrored,
            ``maze.dihedral_keys``). On 7x7 the evaluation set's 64 mazes have 344 such twins among the 704
            training layouts, so "layout" tests a policy on mazes it trained on in another orientation;
            "dihedral" leaves 360 training layouts and tests it on mazes it has not seen in any orientation.
        route_context: where a ``plan_map`` policy writes its route: "picture" (one pass, the route after the
            notes in the picture's context) or "text" (two passes: the policy writes its notes from the picture
            up to ``<answer>``, then the route in a second context of text alone, the route question's
            (``rlkit.sft.route_prompt``: the env's prompt without the picture, then those notes); rlkit.rollout
            runs both and the env acts on the two texts joined). With "text" the route can only come from
            the notes, so the step from notes to route, which route questions on text teach on any maze
            (``sft.route_mix``, ``algorithm.route_coef``), is the policy's only path to a route (session 30).

    Attributes: ``max_turns`` (policy turns), ``action_budget`` (turns or plan steps),
    ``eval_set`` (``EvalSet``), ``eval_set_name``.

    Raises:
        TypeError: an unknown argument (a config key typo).
        ValueError: a bad value, or a parser that does not fit the mode.
        ImportError / RuntimeError: impl="upstream" and the VisGym fork is not installed.
    """

    def __init__(
        self,
        variant: str = "easy",
        mode: str = "interactive",
        max_turns: int = 18,
        parser: str = "tuple",
        cell_size: int = DEFAULT_CELL_SIZE,
        impl: str = "native",
        wall_move: str = "stay",
        train_room_endpoints: float = 0.0,
        train_open_passage: float = 0.0,
        holdout: str = "layout",
        route_context: str = "picture",
    ):
        if variant not in VARIANT_SIZES:
            raise ValueError(f"env.variant must be one of {sorted(VARIANT_SIZES)}, got {variant!r}")
        if mode not in MODES:
            raise ValueError(f"env.mode must be one of {MODES}, got {mode!r}")
        if parser not in MODE_PARSERS[mode]:
            raise ValueError(
                f"env.parser={parser!r} does not fit env.mode={mode!r}; use one of {MODE_PARSERS[mode]}"
            )
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"env.max_turns must be an int >= 1, got {max_turns!r}")
        if isinstance(cell_size, bool) or not isinstance(cell_size, int) or cell_size < 4:
            raise ValueError(f"env.cell_size must be an int >= 4 pixels, got {cell_size!r}")
        if wall_move not in WALL_MOVES:
            raise ValueError(f"env.wall_move must be one of {WALL_MOVES}, got {wall_move!r}")
        if (isinstance(train_room_endpoints, bool) or not isinstance(train_room_endpoints, (int, float))
                or not 0.0 <= train_room_endpoints <= 1.0):
            raise ValueError(f"env.train_room_endpoints must be a share in [0, 1], got {train_room_endpoints!r}")
        if train_room_endpoints and impl != "native":
            raise ValueError("env.train_room_endpoints needs env.impl=native: upstream VisGym draws corner "
                             "endpoints only")
        if (isinstance(train_open_passage, bool) or not isinstance(train_open_passage, (int, float))
                or not 0.0 <= train_open_passage <= 1.0 - train_room_endpoints):
            raise ValueError(f"env.train_open_passage must be a share in [0, 1 - env.train_room_endpoints] = "
                             f"[0, {1.0 - train_room_endpoints:g}], got {train_open_passage!r}")
        if train_open_passage and impl != "native":
            raise ValueError("env.train_open_passage needs env.impl=native: upstream VisGym draws tree mazes only")
        if impl not in IMPLS:
            raise ValueError(f"env.impl must be one of {IMPLS}, got {impl!r}")
        if holdout not in HOLDOUTS:
            raise ValueError(f"env.holdout must be one of {HOLDOUTS}, got {holdout!r}")
        if route_context not in ROUTE_CONTEXTS:
            raise ValueError(f"env.route_context must be one of {ROUTE_CONTEXTS}, got {route_context!r}")
        if route_context == "text" and (mode != "plan" or parser != "plan_map"):
            raise ValueError(f"env.route_context=text writes the route from plan_map's notes in a second context; "
                             f"this env is env.mode={mode} env.parser={parser}. Set env.mode=plan "
                             f"env.parser=plan_map (and rollout.max_new_tokens=64), or env.route_context=picture")
        if impl == "upstream":
            if variant not in UPSTREAM_VARIANTS:
                raise ValueError(
                    f"env.variant={variant!r} exists only in rlkit (impl=native); upstream VisGym has "
                    f"{sorted(UPSTREAM_VARIANTS)}"
                )
            if cell_size != DEFAULT_CELL_SIZE:
                raise ValueError(
                    f"env.cell_size={cell_size} cannot be honoured with impl=upstream "
                    f"(the upstream renderer draws {DEFAULT_CELL_SIZE} px cells)"
                )
            require_upstream(variant)
        self.variant = variant
        self.mode = mode
        self.parser = parser
        self._held_out_walls: frozenset[bytes] | None = None  # route_example's holdout, built on first use
        self.cell_size = cell_size
        self.impl = impl
        self.wall_move = wall_move
        self.train_room_endpoints = float(train_room_endpoints)
        self.train_open_passage = float(train_open_passage)
        self.holdout = holdout
        self.route_context = route_context
        self.route_opening = ROUTE_OPENING
        self.action_budget = max_turns
        self.max_turns = max_turns if mode == "interactive" else 1
        # A parser that reads an <answer> block has all it needs at the first "</answer>": the policy's
        # turn ends there (rollout.stop: null). Text after it would only be noise the reward never reads
        # well: a plan parser reads the last block, so an answer followed by more text can turn a right
        # route into a failure, and nothing in the reward pushes the policy to end its turn (measured on
        # 7x7: 14 of 64 greedy outputs ran on past the answer after 100 GRPO steps).
        self.stop_strings: tuple[str, ...] = ("</answer>",) if parser in ANSWER_BLOCK_PARSERS else ()
        self.eval_set = EVAL_SETS[_EVAL_SET_OF_VARIANT[variant]]
        self.eval_set_name = self.eval_set.name

    def __repr__(self) -> str:
        return (
            f"VisGymMaze(variant={self.variant!r}, mode={self.mode!r}, max_turns={self.action_budget}, "
            f"parser={self.parser!r}, cell_size={self.cell_size}, impl={self.impl!r}, wall_move={self.wall_move!r}"
            + (f", train_room_endpoints={self.train_room_endpoints}" if self.train_room_endpoints else "")
            + (f", train_open_passage={self.train_open_passage}" if self.train_open_passage else "")
            + (f", holdout={self.holdout!r}" if self.holdout != "layout" else "")
            + (f", route_context={self.route_context!r}" if self.route_context != "picture" else "") + ")"
        )

    # -- EnvSpec -------------------------------------------------------------------------------

    def make(self) -> MazeEpisode:
        """A fresh episode env (one per concurrent episode)."""
        if self.impl == "native":
            env = MazeEnv(variant=self.variant, cell_size=self.cell_size)
        else:
            env = UpstreamMazeEnv(variant=self.variant)
        return MazeEpisode(env, mode=self.mode, parser=self.parser, budget=self.action_budget,
                           wall_move=self.wall_move)

    def eval_seeds(self) -> list[int]:
        """Task seeds of the fixed evaluation set (easy, hard: 0..63)."""
        return list(self.eval_set.seeds)

    def is_eval_seed(self, seed: int) -> bool:
        """True if training must skip ``seed``: it is an evaluation seed or draws an evaluation maze (with
        ``holdout="dihedral"``: or one turned or mirrored)."""
        return self.eval_set.holds_layout_of(seed, dihedral=self.holdout == "dihedral")

    def task_key(self, seed: int) -> bytes:
        """The identity of task ``seed`` for per-task statistics (rlkit.tasks.SolvedTaskFilter): its maze
        layout (walls, start and goal), which many seeds share (7x7 has 768 layouts)."""
        return layout_key(int(seed), VARIANT_SIZES[self.variant])

    def training_task(self, seed: int) -> int:
        """The task a training stream seed in [0, 2**31) stands for: ``seed`` itself (its corners), or with
        probability ``train_room_endpoints`` (a coin fixed by the seed) its room-endpoint task
        ``ROOM_TASKS + seed``, with probability ``train_open_passage`` (the same coin) its loop task
        ``LOOP_TASKS + seed`` (rlkit.tasks.training_sampler applies it)."""
        rooms, loops = self.train_room_endpoints, self.train_open_passage
        if not (rooms or loops):
            return int(seed)
        coin = np.random.default_rng([int(seed), 0x5EED]).random()
        if rooms and (rooms >= 1.0 or coin < rooms):
            return ROOM_TASKS + int(seed)
        if loops and coin < rooms + loops:
            return LOOP_TASKS + int(seed)
        return int(seed)

    def train_seed_stream(self, seed: int) -> Iterator[int]:
        """Endless reproducible stream of training task seeds that skips eval mazes (see module doc), each
        mapped by ``training_task``."""
        mapped = self.train_room_endpoints or self.train_open_passage
        return train_seed_stream(seed, self.eval_set, self.training_task if mapped else None,
                                 dihedral=self.holdout == "dihedral")

    # -- supervised warm start -----------------------------------------------------------------

    def solution(self, seed: int) -> list[int]:
        """The shortest solution of task ``seed`` as ``Discrete(5)`` actions, ending with stop (4)."""
        return solution_actions(self.variant, seed)

    def demonstration(self, seed: int) -> list[str]:
        """Assistant texts of the solver's episode on task ``seed`` in this env's output format
        (same as ``self.make().demonstration(seed)``; see ``MazeEpisode.demonstration``)."""
        return demonstration_texts(self.variant, self.mode, self.parser, seed)

    # -- visual grounding pretraining (rlkit.grounding) ----------------------------------------

    grounding_tasks = GROUNDING_TASKS

    def grounding_example(self, seed: int, task: str, rng: np.random.Generator) -> GroundingExample:
        """One grounding question on maze ``seed`` drawn with ``rng`` (see envs/visgym/grounding.py),
        rendered at this env's cell size."""
        return grounding_example(seed, task, rng, variant=self.variant, cell_size=self.cell_size)

    # -- route questions on text (sft.route_mix) ------------------------------------------------

    def route_example(self, rng: np.random.Generator) -> RouteExample:
        """One route question on text alone (envs/visgym/routes.py): ``plan_map``'s notes of a maze of this
        env's size (a training tree, a tree between two rooms, or any wall pattern), and the route after them.
        No example has the walls of an evaluation maze (with ``holdout="dihedral"``, of their turned and
        mirrored images either), and every route fits the plan budget.

        Raises:
            ValueError: the env's parser is not ``plan_map`` (only its notes hold what a route depends on).
        """
        if self.parser != "plan_map":
            raise ValueError(f"route questions on text need env.parser=plan_map, whose notes (the walls and both "
                             f"ends) are what the route is read from; this env writes {self.parser!r}. Set "
                             f"env.parser=plan_map, or sft.route_mix=0")
        if self._held_out_walls is None:
            keys = self.eval_set.twin_layouts() if self.holdout == "dihedral" else self.eval_set.layouts()
            self._held_out_walls = frozenset(k[:-4] for k in keys)  # maze_key: walls, then 4 bytes of ends
        return route_example(VARIANT_SIZES[self.variant], rng, self._held_out_walls, budget=self.action_budget)

    # -- reports -------------------------------------------------------------------------------

    def render_trajectory(self, seed: int, infos: list[dict]) -> Image.Image:
        """The picture of an episode on task ``seed`` from its per-turn infos (``StepOutput.info``,
        in order): the start image with the executed path and the outcome marked (see
        ``envs.visgym.picture``). RGB, the maze's size in pixels."""
        return draw_episode(self.variant, self.cell_size, seed, infos)
