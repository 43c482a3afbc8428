"""Parity with upstream VisGym (commit 0289034), recorded by running upstream's own code.

- Actions: every output of tests/envs/visgym_parity_corpus.py went through upstream's harness
  (``Interactor.parse_output``) and env (``Maze2DEnv.step``); data/visgym_parity_actions.json holds
  the action upstream took. ``parser: tuple`` must take the same one on every output.
- Images: upstream's frames at reset and after every step of scripted episodes (random moves with
  wall bumps, outputs upstream ignores, the solver's route in varied formats, a step off the goal
  and back, stop) in data/visgym_parity_frames.npz. rlkit's frames for the same outputs must equal
  them pixel for pixel, except the one documented difference (envs/visgym/README.md): after the
  agent has left the goal, upstream shows a white disc on it and rlkit a full red cell.

How the data was recorded: tests/envs/data/make_visgym_parity.py (its docstring).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from envs.visgym import VisGymMaze, make_parser, render_array
from envs.visgym.render import GOAL_RED, WHITE, agent_disc_mask
from tests.envs.visgym_parity_corpus import parity_outputs

DATA = Path(__file__).resolve().parent / "data"
ACTION_NAMES = {0: "move 0", 1: "move 1", 2: "move 2", 3: "move 3", 4: "stop"}
#: What upstream raises on, and rlkit treats as a no-op (documented in UpstreamTupleParser).
UPSTREAM_RAISES = {"raises OverflowError"}


@pytest.fixture(scope="module")
def recorded_actions() -> list[dict]:
    return json.loads((DATA / "visgym_parity_actions.json").read_text())["cases"]


@pytest.fixture(scope="module")
def recorded_frames():
    meta = json.loads((DATA / "visgym_parity_frames.json").read_text())
    assert hashlib.sha256((DATA / "visgym_parity_frames.npz").read_bytes()).hexdigest() == meta["npz_sha256"]
    with np.load(DATA / "visgym_parity_frames.npz") as npz:
        frames = [npz[f"f{i}"] for i in range(len(npz.files))]
    palette = np.array(meta["palette"], dtype=np.uint8)
    return meta["episodes"], [palette[f] for f in frames]


def _ours(parser, text: str) -> str | None:
    parsed = parser.parse(text)
    return None if parsed is None else ACTION_NAMES[parsed.actions[0]]


def test_recorded_outputs_are_the_corpus(recorded_actions):
    """The recording is of the current corpus (rerun make_visgym_parity.py after changing it)."""
    assert [(c["category"], c["output"]) for c in recorded_actions] == parity_outputs()


def test_tuple_parser_takes_upstreams_action_on_every_output(recorded_actions):
    parser = make_parser("tuple")
    mismatches = []
    for case in recorded_actions:
        expected = None if case["upstream"] in UPSTREAM_RAISES else case["upstream"]
        got = _ours(parser, case["output"])
        if got != expected:
            mismatches.append((case["category"], case["output"][:80], case["upstream"], got))
    assert len(recorded_actions) >= 250
    assert mismatches == [], f"{len(mismatches)} of {len(recorded_actions)} differ: {mismatches[:10]}"


def test_corpus_covers_the_issue_categories(recorded_actions):
    by_cat = Counter(c["category"] for c in recorded_actions)
    for cat in ("later_tuple", "capitalised", "quoted_direction", "malformed_stop", "short_stop",
                "literal", "curly_quotes", "long", "no_parens", "hostile", "canonical"):
        assert by_cat[cat] >= 5, cat
    actions = Counter(c["upstream"] for c in recorded_actions)
    assert all(actions[a] >= 20 for a in ACTION_NAMES.values()) and actions[None] >= 50
    long_acting = [c for c in recorded_actions if len(c["output"]) > 20_000 and c["upstream"]]
    assert len(long_acting) >= 5  # actions that a reader of the last 20,000 characters would miss
    assert {c["upstream"] for c in recorded_actions} - set(ACTION_NAMES.values()) - {None} == UPSTREAM_RAISES


def test_lenient_parser_is_not_upstream(recorded_actions):
    """``tuple_lenient`` keeps rlkit's earlier reading; it disagrees with upstream on this corpus."""
    parser = make_parser("tuple_lenient")
    differ = sum(_ours(parser, c["output"]) != c["upstream"] for c in recorded_actions)
    assert differ >= 50


def _differences_from_upstream(upstream: np.ndarray, goal, visited_goal: bool, on_goal: bool, cs: int = 25):
    """Upstream's frame with the documented difference applied: the white disc that upstream leaves
    on a goal the agent has left is red in rlkit's frame. Returns (expected frame, pixels changed)."""
    expected = upstream.copy()
    if not visited_goal or on_goal:
        return expected, 0
    cell = expected[goal[0] * cs : (goal[0] + 1) * cs, goal[1] * cs : (goal[1] + 1) * cs]
    disc = agent_disc_mask(cs)
    assert (cell[disc] == WHITE).all() and (cell[~disc] == GOAL_RED).all(), "upstream's white disc on the goal"
    cell[disc] = GOAL_RED
    return expected, int(disc.sum())


def test_images_match_upstream_at_reset_and_after_every_step(recorded_frames):
    episodes, frames = recorded_frames
    compared = repainted = 0
    for ep_rec in episodes:
        spec = VisGymMaze(variant=ep_rec["variant"], mode="interactive", parser="tuple", max_turns=100)
        ep = spec.make()
        obs = ep.reset(ep_rec["seed"])
        goal = tuple(ep.env.goal)
        ours = [np.asarray(obs.images[0])]
        agents = [list(ep.env.agent)]
        for text in ep_rec["outputs"]:
            out = ep.step(text)
            if out.done:
                ours.append(render_array(ep.env.maze_map, ep.env.agent, ep.env.goal))
            else:
                ours.append(np.asarray(out.observation.images[0]))
            agents.append(list(ep.env.agent))
        assert agents == ep_rec["agents"], f"{ep_rec['variant']} seed {ep_rec['seed']}: the agent's cells differ"
        assert ep.success() and len(ours) == len(ep_rec["agents"])
        visited = False
        for i, frame in enumerate(ours):
            on_goal = tuple(agents[i]) == goal
            visited = visited or on_goal
            expected, changed = _differences_from_upstream(frames[ep_rec["first_frame"] + i], goal, visited, on_goal)
            diff = np.argwhere((frame != expected).any(axis=-1))
            assert len(diff) == 0, (
                f"{ep_rec['variant']} seed {ep_rec['seed']} frame {i}: {len(diff)} pixels differ, first {diff[:3].tolist()}"
            )
            compared += 1
            repainted += changed > 0
    assert compared >= 300 and repainted >= len(episodes)  # each episode steps off the goal once
