"""rlkit main job: GRPO post-training of a vision-language policy (see README.md).

    python train.py                                               # CPU default: tiny Qwen3-VL, VisGym maze_2d/easy
    python train.py env=visgym reward=maze_exit -m lr=1e-5,3e-5   # a sweep, with a summary table at the end
    python train.py --cfg job                                     # print the composed config
"""

import hydra
from omegaconf import DictConfig

import rlkit.config  # noqa: F401  (registers the typed schema conf/train.yaml builds on)


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    from rlkit.run import run

    return run(cfg)


if __name__ == "__main__":
    main()
