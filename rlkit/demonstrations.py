"""The env's solver demonstrations as token trajectories, encoded exactly as a rollout would encode them.

A demonstration (``env_spec.demonstration(seed)``, rlkit.types.SupportsDemonstrations: the assistant texts of a
solved episode, in the env's own output format) is replayed through the env to get its observations, and each
turn is encoded with the policy's chat format (rlkit.policy.chat), so the token layout is a rollout's
(rlkit.rollout): loss mask 1 on the demonstrated completion tokens, 0 on everything else. The SFT warm start
(rlkit.stages.sft) trains on them, and GRPO's demonstration term (algorithm.demo_coef, rlkit.algorithms.nll) gets
them from the executor (rlkit.recipes.local, the rollout workers of rlkit.distributed.workers).
"""

from __future__ import annotations

from typing import Any, Iterable

from rlkit.rollout import Trajectory
from rlkit.types import EnvSpec, Episode, SupportsRecoveryDemonstrations


def demonstration_trajectory(env_spec: EnvSpec, policy: Any, seed: int, recovery_rng: Any = None) -> Trajectory | None:
    """Replay the env's solver demonstration for ``seed`` and encode it as a token trajectory.

    With ``recovery_rng`` (a numpy Generator), the env's recovery demonstration drawn with it instead
    (rlkit.types.SupportsRecoveryDemonstrations): its turns with ``imitate`` False keep loss mask 0.

    Returns None when the demonstration does not solve the task within the env's budget (e.g. a
    training maze whose shortest path is longer than the step budget): such tasks are skipped.
    Raises: TypeError when ``recovery_rng`` is given and the env has no ``recovery_demonstration``.
    """
    chat = policy.chat
    env = env_spec.make()
    if recovery_rng is None:
        turns = [(text, True) for text in env_spec.demonstration(seed)]
    elif isinstance(env_spec, SupportsRecoveryDemonstrations):
        turns = env_spec.recovery_demonstration(seed, recovery_rng)
    else:
        raise TypeError(f"{type(env_spec).__name__} has no recovery_demonstration(seed, rng) "
                        "(rlkit.types.SupportsRecoveryDemonstrations); set sft.recovery_share=0")
    obs = env.reset(seed)
    ids: list[int] = []
    mask: list[int] = []
    images: list[Any] = []
    tt = chat.user_turn(obs.text, obs.images, system=env.system_prompt, first=True)
    for turn, (text, imitate) in enumerate(turns):
        ids += tt.input_ids
        mask += [0] * len(tt.input_ids)
        images += tt.image_inputs
        completion = chat.completion_ids(text)  # text tokens + <|im_end|>
        ids += completion
        mask += [int(imitate)] * len(completion)
        end = chat.turn_end_ids("stop")
        ids += end
        mask += [0] * len(end)
        out = env.step(text)
        if out.done or out.observation is None or turn + 1 >= env_spec.max_turns:
            break
        tt = chat.user_turn(out.observation.text, out.observation.images, system=None, first=False)
    record = Episode(seed=seed, turns=[], terminated=True, truncated=False, success=bool(env.success()))
    if not record.success:
        return None
    return Trajectory(ids, mask, [0.0] * len(ids), images, record, group=0, policy_version=-1)


def demonstration_trajectories(env_spec: EnvSpec, policy: Any, seeds: Iterable[int],
                               recovery_share: float = 0.0, rng: Any = None) -> list[Trajectory]:
    """``demonstration_trajectory`` of each seed, in order, leaving out the seeds whose demonstration
    does not solve the task within the env's budget (so the list may be shorter than ``seeds``).

    With ``recovery_share`` > 0, each seed's is a recovery demonstration with that probability, drawn (the coin and
    the mistake) with ``rng``, a numpy Generator (required then)."""
    out = []
    for s in seeds:
        recovery = recovery_share > 0 and float(rng.random()) < recovery_share
        d = demonstration_trajectory(env_spec, policy, s, recovery_rng=rng if recovery else None)
        if d is not None:
            out.append(d)
    return out
