"""The policy-facing VisGym maze episode (``rlkit.types.EpisodeEnv``), in two modes.

- ``interactive`` (VisGym's protocol): multi-turn, one action per turn. Turn 0 shows the maze
  image; each later observation is the new image plus a short feedback text. The episode ends when
  the policy says stop (success if the agent is on the goal); the turn budget is the harness's.
- ``plan``: single-turn. One image in, the whole route out (``plan`` parser), executed action by
  action until stop or the action budget; the episode is done after this one step.

Instructions (task, colours, action format, budget) are in ``system_prompt`` so that they survive
a harness that keeps only the last k turns of history; the turn-0 user text is short.

Per-turn ``StepOutput.info`` (JSON-serialisable, plain ints/lists): ``parse_ok``, ``success``,
``agent``, ``goal``, ``distance`` (L1), ``bfs_distance`` (remaining shortest path, moves),
``start_bfs_distance``, ``feedback``, ``action`` (what was executed: "move right" / "stop" in
interactive mode, the executed route words in plan mode, None if unparsable), ``turn`` (1-based
policy turn), ``hit_wall`` and, in plan mode, ``plan_length`` and ``actions_executed``.
An unparsable output is a no-op with reward 0, ``parse_ok`` False and a feedback saying why.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from PIL import Image

from envs.visgym.gym_env import STOP
from envs.visgym.maze import MOVE_NAMES, VARIANT_SIZES, generate_maze, render_text, solve_moves, step_position
from envs.visgym.parsers import describe_action, make_parser
from rlkit.types import Observation, StepOutput

MODES = ("interactive", "plan")

#: What a move into a wall does. ``stay``: the agent stays in place and the episode goes on (upstream
#: VisGym maze_2d). ``fail``: the episode ends there, unsuccessful. In plan mode ``stay`` makes a bump
#: free (no turn is lost, no feedback is read), so a plan can pad a route with moves that only help when
#: they hit a wall: measured on 7x7, 300 GRPO steps took greedy success 45.3% -> 71.9% while plans that
#: reach the goal without a bump fell from 29 to 18 of 64 (docs/experiments.md). ``fail`` makes success mean a route.
WALL_MOVES = ("stay", "fail")

#: Parsers allowed per mode.
MODE_PARSERS: dict[str, tuple[str, ...]] = {
    "interactive": ("tuple", "tuple_answer", "tuple_lenient", "keyword"),
    "plan": ("plan", "plan_walls"),
}

_TASK = "You are the blue dot in the maze. Reach the red square; gray cells are walls."
_FORMAT = {
    "tuple": "Each turn reply ('move', d) with d 0 right, 1 up, 2 left, 3 down, "
    "or ('stop', 'stop') on the red square.",
    "tuple_lenient": "Each turn reply ('move', d) with d 0 right, 1 up, 2 left, 3 down, "
    "or ('stop', 'stop') on the red square.",
    "tuple_answer": "Each turn reply <answer>('move', d)</answer> with d 0 right, 1 up, 2 left, "
    "3 down, or <answer>('stop', 'stop')</answer> on the red square.",
    "keyword": "Each turn reply <action>X</action>, X one of right, up, left, down, "
    "or stop on the red square.",
    "plan": "Reply with the whole route, e.g. <answer>right right down stop</answer>, "
    "using right, up, left, down, then stop on the red square.",
    "plan_walls": "First write each wall between rooms in reading order, its letter then # closed or . open, "
    "then the whole route, e.g. a#b.c#<answer>right right down stop</answer>, using right, up, left, down, "
    "then stop on the red square.",
}


def system_prompt(mode: str, parser: str, budget: int) -> str:
    """The instructions shown to the policy (about 40 words).

    ``budget`` is the number of turns (interactive) or of actions incl. stop (plan).
    """
    limit = f"You have {budget} turns." if mode == "interactive" else f"At most {budget} steps incl. stop."
    return f"{_TASK} {_FORMAT[parser]} {limit}"


def solution_actions(variant: str, seed: int) -> list[int]:
    """Shortest solution of task ``seed`` as ``Discrete(5)`` actions (moves, then stop = 4)."""
    maze_map, start, goal = generate_maze(seed, VARIANT_SIZES[variant])
    return solve_moves(maze_map, start, goal) + [STOP]


def demonstration_texts(variant: str, mode: str, parser: str, seed: int) -> list[str]:
    """Solver demonstration of task ``seed`` as assistant texts (see ``MazeEpisode.demonstration``)."""
    fmt = make_parser(parser)
    if parser == "plan_walls":
        from envs.visgym.grounding import walls_answer

        maze_map, start, goal = generate_maze(seed, VARIANT_SIZES[variant])
        return [fmt.format(solve_moves(maze_map, start, goal) + [STOP], walls=walls_answer(maze_map)[0])]
    actions = solution_actions(variant, seed)
    if mode == "plan":
        return [fmt.format(actions)]
    return [fmt.format([a]) for a in actions]


def recovery_texts(variant: str, parser: str, seed: int, rng: Any, wall_move: str = "stay") -> list[tuple[str, bool]]:
    """A solver demonstration of task ``seed`` with one mistake in it and the solver's way on from there, for an
    interactive episode: ``[(assistant text, imitate), ...]``, one per turn, ``imitate`` False on the mistake only.

    The mistake is a move other than the solver's at a turn drawn uniformly from the route's moves, its direction
    drawn uniformly from the other three (``rng``, a numpy Generator, draws both). Into a wall (``wall_move`` "stay")
    the agent stays in place and the solver's move follows; into a side corridor the solver walks back. Under
    ``wall_move`` "fail" a wall ends the episode, so only moves into free cells are drawn (a maze whose route has
    no side corridor gets the plain demonstration, every turn imitated). Learning from the turns after a mistake
    that is not itself imitated is DART's recovery data (Laskey et al. 2017, "DART: Noise injection for robust
    imitation learning"): the states a policy reaches after its own errors, which the solver alone never shows.

    Raises: KeyError for a variant not in ``VARIANT_SIZES``; ValueError for a wall_move other than "stay" / "fail".
    """
    if wall_move not in WALL_MOVES:
        raise ValueError(f"wall_move must be one of {WALL_MOVES}, got {wall_move!r}")
    fmt = make_parser(parser)
    maze_map, start, goal = generate_maze(seed, VARIANT_SIZES[variant])
    route = solve_moves(maze_map, start, goal)
    # every (turn, wrong move) the rules allow, so the draw below is uniform over turns that have one
    pos, options = start, []
    for turn, right in enumerate(route):
        wrong = [d for d in range(4) if d != right
                 and (wall_move == "stay" or step_position(maze_map, pos, d) != pos)]
        if wrong:
            options.append((turn, pos, wrong))
        pos = step_position(maze_map, pos, right)
    if not options:
        return [(fmt.format([a]), True) for a in route + [STOP]]
    turn, pos, wrong = options[int(rng.integers(len(options)))]
    mistake = wrong[int(rng.integers(len(wrong)))]
    after = step_position(maze_map, pos, mistake)
    rest = solve_moves(maze_map, after, goal) + [STOP]
    return ([(fmt.format([a]), True) for a in route[:turn]] + [(fmt.format([mistake]), False)]
            + [(fmt.format([a]), True) for a in rest])


class MazeEpisode:
    """One VisGym maze episode for the policy (implements ``rlkit.types.EpisodeEnv``).

    Args:
        env: a ``MazeEnv``-compatible gymnasium env (``Discrete(5)`` actions, info with agent,
            goal, distance, bfs_distance, feedback); native ``MazeEnv`` or ``UpstreamMazeEnv``.
        mode: "interactive" or "plan".
        parser: parser name valid for the mode (see ``MODE_PARSERS``).
        budget: interactive: policy turns (only shown in the prompt and feedback; the harness
            enforces it); plan: the most actions (stop included) executed from one plan.
        wall_move: what a move into a wall does (``WALL_MOVES``): "stay" (upstream) or "fail" (the
            episode ends there, unsuccessful; per-turn info ``hit_wall`` True).

    Raises:
        ValueError: unknown mode or wall_move, a parser not valid for the mode, budget < 1.
    """

    def __init__(self, env: gym.Env, mode: str, parser: str, budget: int, wall_move: str = "stay"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if parser not in MODE_PARSERS[mode]:
            raise ValueError(
                f"parser {parser!r} does not fit mode {mode!r}; use one of {MODE_PARSERS[mode]}"
            )
        if budget < 1:
            raise ValueError(f"budget must be >= 1, got {budget}")
        if wall_move not in WALL_MOVES:
            raise ValueError(f"wall_move must be one of {WALL_MOVES}, got {wall_move!r}")
        self.wall_move = wall_move
        self._hit_wall = False
        self.env = env
        self.mode = mode
        self.parser_name = parser
        self.parser = make_parser(parser)
        self.budget = int(budget)
        self.system_prompt: str | None = system_prompt(mode, parser, self.budget)
        self._info: dict[str, Any] | None = None
        self._obs = None
        self._done = False
        self._success = False
        self._turn = 0
        self._start_bfs = 0

    # -- EpisodeEnv ------------------------------------------------------------------------------

    def reset(self, seed: int) -> Observation:
        """Start task ``seed``; returns the first user message (maze image + a short question)."""
        self._obs, info = self.env.reset(seed=int(seed))
        self._info = dict(info)
        self._done = self._success = self._hit_wall = False
        self._turn = 0
        self._start_bfs = int(info["bfs_distance"])
        text = (
            f"Here is the maze. Turn 1/{self.budget}: your action?"
            if self.mode == "interactive"
            else "Here is the maze. Your route?"
        )
        return Observation(text=text, images=[self._image()])

    def step(self, action_text: str) -> StepOutput:
        """Consume one raw model output. Never raises on a malformed output.

        Raises:
            RuntimeError: called before ``reset`` or after the episode is done.
        """
        if self._info is None:
            raise RuntimeError("MazeEpisode.step() called before reset()")
        if self._done:
            raise RuntimeError("MazeEpisode.step() called after the episode is done; call reset()")
        self._turn += 1
        parsed, reason = self.parser.parse_with_reason(action_text)
        if self.mode == "plan":
            return self._step_plan(parsed, reason)
        return self._step_interactive(parsed, reason)

    def success(self) -> bool:
        """True once the agent has stopped on the goal (upstream success)."""
        return self._success

    def demonstration(self, seed: int) -> list[str]:
        """Assistant texts of the BFS solver's episode on task ``seed``, in this episode's format.

        interactive: one text per turn, e.g. ``('move', 0)`` ... ``('stop', 'stop')`` (the full
        shortest solution, even if longer than the turn budget); plan: one text,
        ``<answer>right ... stop</answer>``. Does not touch the episode's state. Used by the core to
        build supervised warm-start data without knowing the env.
        """
        return demonstration_texts(self.env.variant, self.mode, self.parser_name, seed)

    # -- helpers ---------------------------------------------------------------------------------

    def text(self) -> str:
        """Text picture of the current state (for logs and text-only baselines)."""
        info = self._info
        return render_text(self.env.maze_map, tuple(info["agent"]), tuple(info["goal"]))

    def _image(self) -> Image.Image:
        if self._obs is None:  # not drawn by _apply (plan mode): draw the current state now
            self._obs = self.env.observation()
        return Image.fromarray(self._obs)

    def _apply(self, action: int) -> tuple[float, bool]:
        before = self._info["agent"]
        if self.mode == "plan" and hasattr(self.env, "transition"):
            # a plan's actions show no picture after them: skip drawing one per action (_image draws on demand)
            reward, terminated, info = self.env.transition(action)
            self._obs = None
        else:
            self._obs, reward, terminated, _, info = self.env.step(action)
        self._info = dict(info)
        if self.wall_move == "fail" and action != STOP and info["agent"] == before:
            # the move was refused by a wall: under "fail" the episode ends here, unsuccessful
            self._hit_wall = self._done = True
            self._info["feedback"] = f"Wall: moving {MOVE_NAMES[action]} hit a wall; the episode ends."
            return float(reward), True
        if terminated:
            self._done = True
            self._success = action == STOP and info["agent"] == info["goal"] and reward > 0
        return float(reward), bool(terminated)

    def _turn_info(self, parse_ok: bool, feedback: str, action: str | None) -> dict[str, Any]:
        info = self._info
        return {
            "parse_ok": parse_ok,
            "success": self._success,
            "agent": list(info["agent"]),
            "goal": list(info["goal"]),
            "distance": int(info["distance"]),
            "bfs_distance": int(info["bfs_distance"]),
            "start_bfs_distance": self._start_bfs,
            "feedback": feedback,
            "action": action,
            "turn": self._turn,
            "hit_wall": self._hit_wall,
        }

    def _step_interactive(self, parsed, reason: str) -> StepOutput:
        if parsed is None:
            feedback = f"Could not read your action: {reason}."
            reward, action = 0.0, None
        else:
            a = parsed.actions[0]
            reward, _ = self._apply(a)
            feedback, action = self._info["feedback"], describe_action(a)
        info = self._turn_info(parsed is not None, feedback, action)
        if self._done:
            return StepOutput(observation=None, reward=reward, done=True, info=info)
        nxt = self._turn + 1
        ask = f"Turn {nxt}/{self.budget}: your action?" if nxt <= self.budget else "No turns left."
        obs = Observation(text=f"{feedback} {ask}", images=[self._image()])
        return StepOutput(observation=obs, reward=reward, done=False, info=info)

    def _step_plan(self, parsed, reason: str) -> StepOutput:
        self._done = True
        if parsed is None:
            info = self._turn_info(False, f"Could not read your route: {reason}.", None)
            info.update(plan_length=0, actions_executed=0)
            return StepOutput(observation=None, reward=0.0, done=True, info=info)
        total, executed = 0.0, 0
        for a in parsed.actions[: self.budget]:
            reward, terminated = self._apply(a)
            total += reward
            executed += 1
            if terminated:
                break
        self._done = True
        if self._success:
            feedback = "You stopped on the goal."
        elif self._hit_wall:
            feedback = f"Step {executed} ({MOVE_NAMES[parsed.actions[executed - 1]]}) hit a wall; route failed."
        elif executed and parsed.actions[executed - 1] == STOP:
            feedback = "You stopped off the goal."
        elif len(parsed.actions) > self.budget:
            feedback = f"Route cut at the budget of {self.budget} steps without stop."
        else:
            feedback = "Route ended without stop."
        words = " ".join("stop" if a == STOP else MOVE_NAMES[a] for a in parsed.actions[:executed])
        info = self._turn_info(True, feedback, words)
        info.update(plan_length=len(parsed.actions), actions_executed=executed)
        return StepOutput(observation=None, reward=total, done=True, info=info)

