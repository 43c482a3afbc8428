"""Control runs (rlkit/controls.py): a fixed image hides the maze, shuffled rewards carry no signal."""

import numpy as np
import pytest
import torch

from rlkit.controls import FixedImageEnvSpec, shuffle_rewards


def _pixels(img):
    return np.asarray(img.convert("RGB"))


def test_fixed_image_replaces_every_picture_and_keeps_the_task(interactive_env):
    spec = FixedImageEnvSpec(interactive_env, image_seed=1000)
    fixed = _pixels(interactive_env.make().reset(1000).images[0])
    for seed in (1001, 1002):
        real, blind = interactive_env.make(), spec.make()
        obs_real, obs_blind = real.reset(seed), blind.reset(seed)
        assert obs_blind.text == obs_real.text
        assert not np.array_equal(_pixels(obs_real.images[0]), fixed)  # another maze...
        assert np.array_equal(_pixels(obs_blind.images[0]), fixed)  # ...shown as the fixed one
        # the same actions have the same effect: the env under the control is the real task
        for text in interactive_env.demonstration(seed)[:2]:
            out_real, out_blind = real.step(text), blind.step(text)
            assert (out_blind.reward, out_blind.done, out_blind.info) == (out_real.reward, out_real.done, out_real.info)
            if out_blind.observation is not None:
                assert np.array_equal(_pixels(out_blind.observation.images[0]), fixed)
                assert not np.array_equal(_pixels(out_real.observation.images[0]), fixed)
        assert blind.success() == real.success()
    # task sets and budgets are the wrapped spec's
    assert spec.eval_seeds() == interactive_env.eval_seeds() and spec.max_turns == interactive_env.max_turns


def test_fixed_image_solves_with_the_real_demonstration(plan_env):
    env = FixedImageEnvSpec(plan_env, image_seed=2000).make()
    env.reset(2001)
    for text in plan_env.demonstration(2001):
        env.step(text)
    assert env.success()


def test_fixed_image_refuses_an_env_without_pictures():
    from rlkit.types import Observation

    class TextEnv:
        system_prompt = None

        def reset(self, seed):
            return Observation(text="hi")

    class TextSpec:
        max_turns = 1

        def make(self):
            return TextEnv()

    with pytest.raises(ValueError, match="shuffled_reward"):
        FixedImageEnvSpec(TextSpec(), image_seed=3)


def test_shuffled_rewards_are_a_seeded_permutation():
    r = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0])
    a = shuffle_rewards(r, torch.Generator().manual_seed(5))
    b = shuffle_rewards(r, torch.Generator().manual_seed(5))
    c = shuffle_rewards(r, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a.sort().values, r.sort().values)  # the same rewards, other owners
    assert not torch.equal(a, r)
