"""Record upstream VisGym's behaviour for tests/envs/test_visgym_parity.py (not run by the tests).

Writes, next to this file:
- visgym_parity_actions.json: model-like outputs with the action upstream takes on each
  ("move 0".."move 3", "stop", null for a no-op, "raises <Error>" when upstream raises);
- visgym_parity_frames.npz + visgym_parity_frames.json: upstream's images (as palette indices) at
  reset and after every step of scripted episodes, with the outputs fed to each step.

It runs upstream's own code: the harness's ``Interactor.parse_output`` then ``Maze2DEnv.step``, as
the harness does. Upstream's package is a fork of gymnasium, so run this with a Python where that
fork is importable and real gymnasium is not (numpy, pygame 2.6.1 and pillow installed), e.g.:

    python3.11 -m venv /tmp/upvenv && /tmp/upvenv/bin/pip install numpy==1.26.4 pygame==2.6.1 \
        pillow cloudpickle typing-extensions farama-notifications
    /tmp/upvenv/bin/python tests/envs/data/make_visgym_parity.py --visgym /path/to/VisGym  # @0289034

The outputs themselves come from ``parity_outputs()`` in tests/envs/visgym_parity_corpus.py (plain
Python, imported by path), so the test and the recording share one corpus.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import random
import sys
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PALETTE = [(255, 255, 255), (169, 169, 169), (255, 0, 0), (0, 0, 255)]


def _load_corpus():
    spec = importlib.util.spec_from_file_location("visgym_parity_corpus", HERE.parent / "visgym_parity_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _import_upstream(visgym: Path):
    sys.path.insert(0, str(visgym))
    # The harness module imports notebook widgets and the VLM clients; parse_output needs none of them.
    for name in ("ipywidgets", "IPython", "IPython.display"):
        stub = sys.modules.setdefault(name, types.ModuleType(name))
        stub.__getattr__ = lambda attr: object  # widget classes appear only in annotations
    sys.modules["IPython.display"].display = lambda *a, **k: None
    vlm = types.ModuleType("gymnasium.vlm.vlm")
    vlm.BaseVLM = object
    sys.modules["gymnasium.vlm.vlm"] = vlm
    import gymnasium as gym  # the fork

    from gymnasium.vlm.interactor import Interactor

    assert hasattr(gym, "VLMEnvMixin"), "this gymnasium is not the VisGym fork"
    return gym, Interactor


def _action(env, text: str, parse) -> str | None:
    """What upstream does with ``text`` from the centre of an open 7x7 room (every move changes cells)."""
    env.reset(init_state={"maze_map": _ROOM.tolist(), "agent_location": [4, 4], "target_location": [1, 1]})
    try:
        _, _, terminated, _, info = env.step(parse(text))
    except Exception as e:  # noqa: BLE001 - upstream raising is a recorded outcome
        return f"raises {type(e).__name__}"
    if terminated:
        return "stop"
    delta = tuple(int(v) for v in np.asarray(info["agent"]) - np.array([4, 4]))
    moves = {(0, 1): 0, (-1, 0): 1, (0, -1): 2, (1, 0): 3}
    return None if delta == (0, 0) else f"move {moves[delta]}"


_ROOM = np.ones((9, 9), dtype=int)
_ROOM[1:-1, 1:-1] = 0


def _indices(frame: np.ndarray) -> np.ndarray:
    out = np.full(frame.shape[:2], 255, dtype=np.uint8)
    for i, colour in enumerate(PALETTE):
        out[(frame == colour).all(axis=-1)] = i
    assert (out != 255).all(), "a colour outside upstream's palette"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--visgym", type=Path, required=True, help="checkout of upstream VisGym (commit 0289034)")
    args = ap.parse_args()
    gym, Interactor = _import_upstream(args.visgym)
    harness = Interactor.__new__(Interactor)  # parse_output reads no instance state
    corpus = _load_corpus()

    env = gym.make("maze_2d/easy").unwrapped
    cases = [
        {"category": cat, "output": text, "upstream": _action(env, text, harness.parse_output)}
        for cat, text in corpus.parity_outputs()
    ]
    (HERE / "visgym_parity_actions.json").write_text(json.dumps({
        "source": "upstream VisGym commit 0289034: Interactor.parse_output, then Maze2DEnv.step, "
                  "from the centre of an open room; null = no-op",
        "cases": cases,
    }, indent=1, ensure_ascii=True) + "\n")

    frames, episodes = [], []
    for variant, seed in corpus.PARITY_EPISODES:
        env = gym.make(f"maze_2d/{variant}").unwrapped  # fresh: reset() on a reused env shows the old maze
        obs, info = env.reset(seed=seed)
        ep = {"variant": variant, "seed": seed, "outputs": [], "first_frame": len(frames),
              "agents": [np.asarray(info["agent"]).tolist()]}
        frames.append(_indices(obs))
        rng = random.Random(1000 * seed + len(variant))
        wrappers = corpus.WRAPPERS

        def step(text: str) -> bool:
            obs, _, terminated, _, info = env.step(harness.parse_output(text))
            frames.append(_indices(obs))
            ep["outputs"].append(text)
            ep["agents"].append(np.asarray(info["agent"]).tolist())
            return terminated

        # a few random moves (wall bumps included) and outputs upstream ignores
        for _ in range(3):
            step(rng.choice(wrappers).format(f"('move', {rng.randrange(4)})"))
        step("('Move', 0)")
        step("no idea")
        # the solver's route from here (upstream's own solver), in varied formats
        route = [a for a in env.solve() if "stop" not in a]
        for a in route:
            step(rng.choice(wrappers).format(a))
        # off the goal and back (upstream leaves a white disc on the goal), then stop
        goal = np.asarray(env._target_location)
        for d, delta in env._action_to_direction.items():
            if env.maze_map[tuple(goal + delta)] == 0:
                step(f"('move', {d})")
                step(f"('move', {(d + 2) % 4})")
                break
        assert step("('stop', 'stop')"), "the scripted episode should end on stop"
        episodes.append(ep)
    np.savez_compressed(HERE / "visgym_parity_frames.npz", **{f"f{i}": f for i, f in enumerate(frames)})
    digest = hashlib.sha256((HERE / "visgym_parity_frames.npz").read_bytes()).hexdigest()
    (HERE / "visgym_parity_frames.json").write_text(json.dumps({
        "source": "upstream VisGym commit 0289034, Maze2DEnv: reset() on a fresh env, then step(parse_output(text))",
        "palette": PALETTE, "npz_sha256": digest, "episodes": episodes,
    }, indent=1) + "\n")
    print(f"{len(cases)} outputs, {len(frames)} frames in {len(episodes)} episodes")


if __name__ == "__main__":
    main()
