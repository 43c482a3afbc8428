"""``VisGymMaze``: the EnvSpec that conf/env/visgym*.yaml instantiates, and the fixed eval sets.

Evaluation sets are named, versioned objects: ``visgym_easy_64`` (maze_2d/easy seeds 0..63, the
upstream VisGym evaluation set), ``visgym_hard_64`` (maze_2d/hard seeds 0..63) and ``visgym_small_64``
(rlkit's 7x7 variant: the first 64 seeds with pairwise distinct layouts). Training must never see
them: ``is_eval_seed`` says which seeds to skip (rlkit.tasks.TaskSampler asks it of every draw). It
compares layouts (walls, start and goal; ``maze.layout_key``), not only seed numbers: another seed can draw
an evaluation maze again (a 9x9 warm start of 25,600 mazes drew eval mazes 40 and 20 before this check; 7x7
has only 768 layouts).

Step budgets on the eval sets (shortest path + 1 stop): easy needs 13 turns (50 mazes) or 17 turns
(14 mazes), so 15 turns admit 50/64 and 18 turns all 64; hard needs 17 to 33 turns (30 turns,
the VisGym paper's budget, admit 63/64). Reports state the budget next to the success rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from envs.visgym.episode import (MODE_PARSERS, MODES, WALL_MOVES, MazeEpisode, demonstration_texts, recovery_texts,
                                  solution_actions)

#: Parsers that read the content of an ``<answer>...</answer>`` block (the others read the whole text, as upstream).
ANSWER_BLOCK_PARSERS: tuple[str, ...] = ("plan", "plan_walls", "tuple_answer")
from envs.visgym.gym_env import MazeEnv
from envs.visgym.maze import VARIANT_SIZES, dihedral_keys, generate_maze, layout_key
from envs.visgym.grounding import GROUNDING_TASKS, GroundingExample, grounding_example
from envs.visgym.picture import draw_episode
from envs.visgym.render import DEFAULT_CELL_SIZE
from envs.visgym.upstream import UPSTREAM_VARIANTS, UpstreamMazeEnv, require_upstream

IMPLS = ("native", "upstream")

#: What training keeps out (``VisGymMaze(holdout=...)``): the evaluation mazes, or also their dihedral images.
HOLDOUTS = ("layout", "dihedral")


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
            plan: "plan", "plan_walls" (envs/visgym/parsers.py).
        cell_size: pixels per maze cell in the image (25 as upstream: 225x225 easy, 275x275 hard).
        impl: "native" (``MazeEnv``, this package) or "upstream" (the VisGym fork, must be installed).
        wall_move: what a move into a wall does: "stay" (upstream VisGym: the agent stays in place)
            or "fail" (the episode ends there, unsuccessful). rlkit's plan-mode configs use "fail": with
            "stay" a plan can pad its route with moves that are free when they hit a wall, and GRPO
            learns that padding instead of routes (envs/visgym/episode.py WALL_MOVES).
        holdout: what training keeps out besides the evaluation mazes themselves: "layout" (every seed that
            draws one of them) or "dihedral" (also every maze that is one of them turned or mirrored,
            ``maze.dihedral_keys``). On 7x7 the evaluation set's 64 mazes have 344 such twins among the 704
            training layouts, so "layout" tests a policy on mazes it trained on in another orientation;
            "dihedral" leaves 360 training layouts and tests it on mazes it has not seen in any orientation.

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
        holdout: str = "layout",
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
        if impl not in IMPLS:
            raise ValueError(f"env.impl must be one of {IMPLS}, got {impl!r}")
        if holdout not in HOLDOUTS:
            raise ValueError(f"env.holdout must be one of {HOLDOUTS}, got {holdout!r}")
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
        self.cell_size = cell_size
        self.impl = impl
        self.wall_move = wall_move
        self.holdout = holdout
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
            + (f", holdout={self.holdout!r}" if self.holdout != "layout" else "") + ")"
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

    # -- supervised warm start -----------------------------------------------------------------

    def solution(self, seed: int) -> list[int]:
        """The shortest solution of task ``seed`` as ``Discrete(5)`` actions, ending with stop (4)."""
        return solution_actions(self.variant, seed)

    def demonstration(self, seed: int) -> list[str]:
        """Assistant texts of the solver's episode on task ``seed`` in this env's output format
        (same as ``self.make().demonstration(seed)``; see ``MazeEpisode.demonstration``)."""
        return demonstration_texts(self.variant, self.mode, self.parser, seed)

    def recovery_demonstration(self, seed: int, rng: np.random.Generator) -> list[tuple[str, bool]]:
        """The solver's episode on task ``seed`` with one mistake drawn by ``rng`` and the way on from it, as
        ``[(assistant text, imitate), ...]`` (``envs.visgym.episode.recovery_texts``, under this env's wall_move).

        Raises: ValueError in plan mode (one turn: there is no later turn to recover in).
        """
        if self.mode != "interactive":
            raise ValueError("recovery demonstrations need env.mode=interactive (a plan is one turn); "
                             "set sft.recovery_share=0")
        return recovery_texts(self.variant, self.parser, seed, rng, self.wall_move)

    # -- visual grounding pretraining (rlkit.stages.grounding) ----------------------------------------

    grounding_tasks = GROUNDING_TASKS
    grounding_bits_name = "wall_bits"  # the bits its questions ask, as accuracy tables name them
    eval_holdout_keys = ("holdout",)  # config keys that decide what training holds out of the evaluation set

    def grounding_example(self, seed: int, task: str, rng: np.random.Generator) -> GroundingExample:
        """One grounding question on maze ``seed`` drawn with ``rng`` (see envs/visgym/grounding.py),
        rendered at this env's cell size."""
        return grounding_example(seed, task, rng, variant=self.variant, cell_size=self.cell_size)

    # -- reports -------------------------------------------------------------------------------

    def render_trajectory(self, seed: int, infos: list[dict]) -> Image.Image:
        """The picture of an episode on task ``seed`` from its per-turn infos (``StepOutput.info``,
        in order): the start image with the executed path and the outcome marked (see
        ``envs.visgym.picture``). RGB, the maze's size in pixels."""
        return draw_episode(self.variant, self.cell_size, seed, infos)
