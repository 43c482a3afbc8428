"""rlkit main job: GRPO post-training of a vision-language policy (see README.md).

    python train.py                                               # CPU default: tiny Qwen3-VL, VisGym maze_2d/easy
    python train.py env=visgym reward=maze_exit -m lr=1e-5,3e-5   # a sweep, with a summary table at the end
    python train.py --cfg job                                     # print the composed config

The same Hydra app, with the same config, is the `rlkit-train` command of an installed rlkit (rlkit/train.py).
"""

from rlkit.train import cli

if __name__ == "__main__":
    cli()
