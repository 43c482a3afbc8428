"""control=fixed_image on backend=native_ray: the rollout workers build their own envs, so they wrap
them as the driver does (RolloutSpec.fixed_image_seed; rlkit/controls.py)."""

import numpy as np
import torch

from rlkit.distributed.workers import RolloutSpec, RolloutWorker


def _pixels(obs):
    return [np.asarray(img.convert("RGB")) for img in obs.images]


def _worker(policy_node, env_node, tmp_path, fixed_image_seed):
    spec = RolloutSpec(env=env_node, policy=policy_node, base_path=None, sync_root=str(tmp_path), sync_timeout_s=1.0,
                       threads=1, device_type="cpu", fixed_image_seed=fixed_image_seed)
    return RolloutWorker(0, spec)  # in this process: the class Ray runs as an actor


def test_rollout_worker_shows_the_fixed_image_in_its_envs_and_demonstrations(policy_node, env_node, tmp_path):
    real = _worker(policy_node, env_node, tmp_path, None)
    blind = _worker(policy_node, env_node, tmp_path, 1000)
    fixed = _pixels(real.env_spec.make().reset(1000))
    for seed in (1001, 1002):
        obs_real, obs_blind = real.env_spec.make().reset(seed), blind.env_spec.make().reset(seed)
        assert obs_blind.text == obs_real.text
        assert len(fixed) == len(obs_real.images) == 1
        assert not np.array_equal(_pixels(obs_real)[0], fixed[0])  # another maze...
        assert np.array_equal(_pixels(obs_blind)[0], fixed[0])  # ...shown as the fixed one
    # the demonstration term's trajectories come from the same wrapped envs: the same route and tokens,
    # the fixed maze's pixels
    (demo_real,), (demo_blind,), (demo_fixed,) = (real.demonstrations([1001]), blind.demonstrations([1001]),
                                                  real.demonstrations([1000]))
    assert demo_blind.input_ids == demo_real.input_ids and demo_blind.episode.success
    px = [d.image_inputs[0].pixel_values for d in (demo_real, demo_blind, demo_fixed)]
    assert not torch.equal(px[1], px[0]) and torch.equal(px[1], px[2])
