"""Control runs: the same job, made unable to learn from what it should learn from.

A rising success curve is evidence that a policy learned its task only beside a control that cannot
learn it (a policy can climb by learning the task's prior, e.g. the most common route, without
reading its observation). ``control`` in conf/train.yaml picks one; it applies to the GRPO stage only
(the warm start is the same checkpoint as the real run's, so both curves start from the same policy):

- ``fixed_image``: every image the policy is shown, in training rollouts and in evaluation, is
  replaced by the first observation's images of one fixed training task (``FixedImageEnvSpec``). The
  env itself, its rewards and its success are those of the real task, so what the policy can still
  learn is what needs no picture: the answer prior (and the text of the observation). backend=native
  wraps its env spec; backend=native_ray's rollout workers wrap their own (RolloutSpec.fixed_image_seed).
- ``shuffled_reward``: each step's rewards are permuted across the batch before the group
  advantages are computed (``shuffle_rewards``), so an advantage says nothing about the
  trajectory it weights; logged rewards stay the real ones. Any backend that computes advantages
  in the driver (native, native_ray).

This follows the practice of reporting a learning curve beside a negative control (e.g. "fixed
image" / "shuffled label" baselines); nothing here changes the real run.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import torch

from rlkit import types
from rlkit.types import Observation, StepOutput

#: The values of ``control`` (None: the real run).
CONTROLS = ("fixed_image", "shuffled_reward")


class _FixedImageEnv:
    """An EpisodeEnv whose observations carry ``images`` instead of their own (same text, rewards,
    success). Everything else is the wrapped env's."""

    def __init__(self, env: Any, images: list[Any]) -> None:
        self._env = env
        self._images = images

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def _blind(self, obs: Observation | None) -> Observation | None:
        if obs is None:
            return None
        return replace(obs, images=list(self._images[: len(obs.images)]) if obs.images else [])

    def reset(self, seed: int) -> Observation:
        return self._blind(self._env.reset(seed))

    def step(self, action_text: str) -> StepOutput:
        out = self._env.step(action_text)
        return replace(out, observation=self._blind(out.observation))

    def success(self) -> bool:
        return self._env.success()


#: The members of rlkit.types' optional capabilities (``Supports*``): attributes and methods.
CAPABILITY_MEMBERS = tuple(dict.fromkeys(
    name for proto in (getattr(types, n) for n in dir(types) if n.startswith("Supports"))
    for name in [*getattr(proto, "__annotations__", {}),
                 *(k for k, v in vars(proto).items() if callable(v) and not k.startswith("_"))]))


@functools.lru_cache(maxsize=None)
def _forwarding(cls: type, names: tuple[str, ...]) -> type:
    """``cls`` with a property per name that reads it from the wrapped spec: from Python 3.12 on, ``isinstance``
    with a runtime-checkable protocol looks members up statically (``inspect.getattr_static``), past
    ``__getattr__``, so a capability forwarded only by ``__getattr__`` would not count."""
    if not names:
        return cls
    props = {n: property(lambda self, n=n: getattr(self._spec, n)) for n in names}
    return type(cls.__name__, (cls,), {**props, "__qualname__": cls.__qualname__, "__module__": cls.__module__})


class FixedImageEnvSpec:
    """An EnvSpec whose envs show one fixed picture: the first observation's images of task
    ``image_seed`` (a training seed). Task sets, turn budget and everything else are the wrapped spec's,
    its optional capabilities (rlkit.types ``Supports*``) included: ``isinstance(wrapper, SupportsX)`` is
    ``isinstance(spec, SupportsX)``.

    Raises: ValueError if the first observation of ``image_seed`` has no image (an env without
    pictures has nothing to hide; use control=shuffled_reward).
    """

    def __new__(cls, spec: Any, image_seed: int) -> FixedImageEnvSpec:
        return super().__new__(_forwarding(cls, tuple(n for n in CAPABILITY_MEMBERS if hasattr(spec, n))))

    def __reduce__(self) -> tuple[Any, ...]:  # the class is built per capability set: pickle by its arguments
        return FixedImageEnvSpec, (self._spec, self.image_seed)

    def __init__(self, spec: Any, image_seed: int) -> None:
        self._spec = spec
        self.image_seed = int(image_seed)
        first = spec.make().reset(self.image_seed)
        if not first.images:
            raise ValueError(
                f"control=fixed_image: the env's first observation (task {image_seed}) has no image to fix; "
                "use control=shuffled_reward for an env without pictures"
            )
        self.images = list(first.images)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spec, name)

    def make(self) -> _FixedImageEnv:
        return _FixedImageEnv(self._spec.make(), self.images)


def fixed_image_seed(seed: int, spec: Any) -> int:
    """The training task whose first picture a control=fixed_image run with ``seed`` (conf/train.yaml's
    ``seed``) shows everywhere: the first task of ``TaskSampler(seed + 1, spec.is_eval_seed)``, a training task
    drawn apart from the run's own stream. The training backends and scripts/eval.py use this, so an adapter of
    a control run is evaluated on the picture it trained on."""
    from rlkit.tasks import TaskSampler

    return TaskSampler(int(seed) + 1, spec.is_eval_seed).sample(1)[0]


def shuffle_rewards(rewards: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random permutation of ``rewards`` [N] across the whole batch (``torch.randperm`` drawn from
    ``generator``): the control=shuffled_reward run's rewards, from which advantages are computed.
    Returns a new tensor [N] with the same values."""
    return rewards[torch.randperm(rewards.numel(), generator=generator)]
