"""How a GRPO step's batch is drawn: tasks, rollouts, their rewards and the auxiliary terms' data.

``StepSampler.sample(step)`` is the sampling and scoring half of one step (rlkit.recipes.grpo calls it, then
computes the group advantages and runs the update).
The strategy is a typed class the config group names by ``_target_`` (conf/sampling/; rlkit.sampling.strategies):
``PlainSampling`` rolls out ``tasks_per_step`` new training tasks x ``group_size`` samples; ``DapoSampling`` is
DAPO's dynamic sampling (rlkit.sampling.dynamic). With
``aux_loss.demo_coef > 0`` the step also carries the solver's demonstrations of the tasks no sample solved
(rlkit.sampling.demos). The sampler reads no policy weights itself: it samples through the ``rollout`` callable
it is given, with the adapter version that callable chooses, so a backend can sample step s + 1 while step s's
update runs.
"""

from rlkit.sampling.step import SampledBatch, StepSampler
from rlkit.sampling.strategies import DapoSampling, PlainSampling, sampling_strategy

__all__ = ["DapoSampling", "PlainSampling", "SampledBatch", "StepSampler", "sampling_strategy"]
