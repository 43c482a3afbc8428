"""The driver's side of the data-parallel update and the backend's settings (no Ray needed)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
import torch

from rlkit.algorithms.nll import AuxTerm
from rlkit.config import AlgorithmConfig
from rlkit.distributed.runtime import RaySettings
from rlkit.distributed.update import plan_update, split_even


_uid = itertools.count()


@dataclass
class _Traj:
    tokens: int
    image_inputs: tuple = ()
    input_ids: list = field(default_factory=lambda: [next(_uid)])  # every sample distinct
    loss_mask: list = field(default_factory=lambda: [1])
    sampling_logprobs: list = field(default_factory=lambda: [0.0])

    @property
    def num_policy_tokens(self) -> int:
        return self.tokens


def test_split_even():
    assert split_even(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_even([1], 3) == [[1], [], []]
    assert split_even([], 2) == [[], []]


def test_plan_shuffles_like_grpo_update_and_splits_each_minibatch():
    trajs = [_Traj(t) for t in (3, 0, 5, 2, 7, 1, 4)]  # sequence 1 has no policy tokens
    adv = torch.tensor([1.0, 0.5, -1.0, 0.0, 0.3, -0.2, 0.9])
    cfg = AlgorithmConfig(update_epochs=2, mini_batch_size=4, micro_batch_size=1)
    gen = torch.Generator().manual_seed(0)
    plan = plan_update(trajs, adv, cfg, world_size=2, generator=gen)
    # the same draws as rlkit.update.grpo_update: one randperm of the kept sequences per epoch
    ref = torch.Generator().manual_seed(0)
    keep = [0, 2, 3, 4, 5, 6]
    orders = [[keep[j] for j in torch.randperm(len(keep), generator=ref).tolist()] for _ in range(2)]
    assert gen.get_state().equal(ref.get_state())
    minibatches = [o[s : s + 4] for o in orders for s in range(0, 6, 4)]
    assert len(plan) == 2 and all(len(p.steps) == len(minibatches) == 4 for p in plan)
    for k, batch in enumerate(minibatches):
        r0, r1 = plan[0].steps[k], plan[1].steps[k]
        assert r0.indices + r1.indices == batch  # contiguous shares, in order
        assert abs(len(r0.indices) - len(r1.indices)) <= 1
        assert r0.total_tokens == r1.total_tokens == sum(trajs[i].tokens for i in batch)
        assert r0.total_seqs == len(batch) and r0.num_micro == r1.num_micro == max(len(r0.indices), len(r1.indices))
        for r in (r0, r1):
            assert r.filler in batch
    for p in plan:
        needed = {i for s in p.steps for i in [*s.indices, s.filler]}
        assert set(p.trajectories) == needed == set(p.advantages)


def test_single_rank_plan_orders_each_minibatch_group_by_group():
    @dataclass
    class _GTraj(_Traj):
        group: int = 0

    trajs = [_GTraj(2, group=g) for g in (0, 0, 1, 1, 2, 2)]
    adv = torch.ones(6)
    for shared in (True, False):
        cfg = AlgorithmConfig(micro_batch_size=2, shared_prefix=shared)
        (plan,) = plan_update(trajs, adv, cfg, world_size=1, generator=torch.Generator().manual_seed(0))
        order = [trajs[i].group for i in plan.steps[0].indices]
        ref = [trajs[i].group for i in torch.randperm(6, generator=torch.Generator().manual_seed(0)).tolist()]
        if shared:  # as grpo_update: whole groups per micro-batch (the shuffle still picks the groups' order)
            assert order == sorted(ref, key=ref.index)
        else:
            assert order == ref


def test_plan_skips_when_nothing_is_kept_without_drawing():
    trajs = [_Traj(2), _Traj(3)]
    cfg = AlgorithmConfig(filter_zero_variance_groups=True)
    gen = torch.Generator().manual_seed(1)
    state = gen.get_state()
    assert plan_update(trajs, torch.zeros(2), cfg, 2, gen) is None
    assert gen.get_state().equal(state)


def _share(plan, k=0):
    """Each rank's (sequences, weight) of the k-th auxiliary term."""
    return [(p.aux_shares[k].sequences, p.aux_shares[k].weight) for p in plan]


def test_plan_splits_the_demonstrations_by_tokens_and_steps_on_them_alone():
    trajs = [_Traj(t) for t in (3, 5, 2, 4)]
    demos = [_Traj(10), _Traj(20), _Traj(30)]
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    gen, ref = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
    plan = plan_update(trajs, adv, AlgorithmConfig(), 2, gen, aux_terms=[AuxTerm("demo", 0.3, demos)])
    plan_ref = plan_update(trajs, adv, AlgorithmConfig(), 2, ref)
    assert gen.get_state().equal(ref.get_state())  # the demonstrations draw nothing from the shuffle stream
    assert [p.steps for p in plan] == [p.steps for p in plan_ref]
    assert [p.aux_shares[0].sequences for p in plan] == [demos[:2], demos[2:]]
    assert [p.aux_shares[0].weight for p in plan] == pytest.approx([0.5, 0.5])  # 30 and 30 of the 60 tokens
    assert all((p.aux_shares[0].name, p.aux_shares[0].coef) == ("demo", 0.3) for p in plan)
    # 3 ranks, 1 demonstration: the others run it as a filler with weight 0
    plan = plan_update(trajs, adv, AlgorithmConfig(), 3, torch.Generator(), aux_terms=[AuxTerm("demo", 0.3, demos[:1])])
    assert _share(plan) == [(demos[:1], 1.0), (demos[:1], 0.0), (demos[:1], 0.0)]
    # nothing kept: one optimizer step of demonstrations alone, without drawing
    zero = AlgorithmConfig(filter_zero_variance_groups=True)
    state = gen.get_state()
    plan = plan_update(trajs, torch.zeros(4), zero, 2, gen, aux_terms=[AuxTerm("demo", 0.3, demos)])
    assert gen.get_state().equal(state)
    assert [(p.steps[0].indices, p.steps[0].num_micro, len(p.steps)) for p in plan] == [([], 0, 1)] * 2
    assert sum(p.aux_shares[0].weight for p in plan) == pytest.approx(1.0)
    # coef 0 ignores them
    assert plan_update(trajs, torch.zeros(4), zero, 2, gen, aux_terms=[AuxTerm("demo", 0.0, demos)]) is None


def test_each_auxiliary_term_is_split_across_the_ranks_with_weights_summing_to_one():
    trajs = [_Traj(t) for t in (3, 2)]
    adv = torch.tensor([1.0, -1.0])
    demos = [_Traj(10), _Traj(20), _Traj(30)]
    extra = [_Traj(t) for t in (4, 6, 5)]
    terms = [AuxTerm("demo", 0.3, demos), AuxTerm("off", 0.0, extra), AuxTerm("extra", 0.7, extra)]
    for ranks in (1, 2, 3, 4):
        plan = plan_update(trajs, adv, AlgorithmConfig(), ranks, torch.Generator().manual_seed(0), aux_terms=terms)
        for p in plan:  # the active terms, in the order given (the coef-0 term is left out)
            assert [(a.name, a.coef) for a in p.aux_shares] == [("demo", 0.3), ("extra", 0.7)]
        for k, seqs in ((0, demos), (1, extra)):
            assert sum(p.aux_shares[k].weight for p in plan) == pytest.approx(1.0), (ranks, k)
            # every sequence is on exactly one rank with weight; the rest are zero-weight fillers
            real = [q for p in plan if p.aux_shares[k].weight > 0 for q in p.aux_shares[k].sequences]
            assert real == seqs, (ranks, k)
    plan = plan_update(trajs, adv, AlgorithmConfig(), 2, torch.Generator().manual_seed(0), aux_terms=terms)
    assert _share(plan, 1) == [(extra[:2], pytest.approx(10 / 15)), (extra[2:], pytest.approx(5 / 15))]
    # more ranks than sequences and nothing kept: a zero-weight filler, one step on the terms alone
    plan = plan_update(trajs, torch.zeros(2), AlgorithmConfig(filter_zero_variance_groups=True), 3,
                       torch.Generator(), aux_terms=[AuxTerm("extra", 0.5, extra[:1])])
    assert _share(plan) == [(extra[:1], 1.0), (extra[:1], 0.0), (extra[:1], 0.0)]
    assert all(len(p.steps) == 1 and p.steps[0].indices == [] for p in plan)
    # no term: no share
    plain = plan_update(trajs, adv, AlgorithmConfig(), 2, torch.Generator().manual_seed(0))
    assert all(p.aux_shares == [] for p in plain)


def test_more_ranks_than_sequences_gives_filler_only_ranks():
    trajs = [_Traj(4), _Traj(6)]
    plan = plan_update(trajs, torch.tensor([1.0, -1.0]), AlgorithmConfig(micro_batch_size=4), 3, torch.Generator())
    assert [len(p.steps[0].indices) for p in plan] == [1, 1, 0]
    assert plan[2].steps[0].num_micro == 1 and plan[2].steps[0].filler in (0, 1)


def test_settings_layout_and_errors():
    colo = RaySettings(num_workers=2, colocate=True, cpus_per_worker=1)
    assert colo.num_rollout_workers == 2 and colo.bundles() == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert [colo.rollout_bundle(j) for j in range(2)] == [0, 1]
    assert colo.actor_resources() == {"num_cpus": 0.5, "num_gpus": 0.0}
    sep = RaySettings(num_workers=2, num_rollout_workers=1, colocate=False, cpus_per_worker=2, gpus_per_worker=1)
    assert sep.bundles() == [{"CPU": 2.0, "GPU": 1.0}] * 3 and sep.rollout_bundle(0) == 2
    assert sep.actor_resources() == {"num_cpus": 2.0, "num_gpus": 1.0}
    assert sep.device_type == "cuda" and sep.use_mixed_precision and sep.threads_per_actor == 2
    assert not colo.use_mixed_precision and colo.device_type == "cpu"
    # replicated ranks compute in the policy's dtype: FSDP2's mixed-precision policy does not apply
    assert colo.strategy == "fsdp" and not RaySettings(gpus_per_worker=1, strategy="ddp").use_mixed_precision
    for bad, match in [(dict(num_workers=0), "num_workers"), (dict(placement_strategy="TIGHT"), "placement_strategy"),
                       (dict(keep_versions=0), "keep_versions"), (dict(mixed_precision=True), "needs GPUs"),
                       (dict(strategy="zero3"), "backend.strategy='zero3'"),
                       (dict(strategy="ddp", gpus_per_worker=1, mixed_precision=True), "strategy=ddp computes")]:
        with pytest.raises(ValueError, match=match):
            RaySettings(**bad).validate()


def test_backend_config_composes_and_refuses_bad_keys(compose_config):
    from hydra.utils import instantiate

    from rlkit.backends.ray_native import RayNativeBackend
    from rlkit.run import ConfigError, instantiate_plugin

    cfg = compose_config(["backend=native_ray", "backend.num_workers=2", "backend.colocate=false"])
    backend = instantiate(cfg.backend)
    assert isinstance(backend, RayNativeBackend)
    assert backend.settings.num_workers == 2 and backend.settings.num_rollout_workers == 2 and not backend.settings.colocate
    with pytest.raises(ConfigError, match="num_worker"):
        instantiate_plugin(compose_config(["backend=native_ray", "+backend.num_worker=2"]).backend, "backend")
    with pytest.raises(ConfigError, match="needs GPUs"):
        instantiate_plugin(compose_config(["backend=native_ray", "backend.mixed_precision=true"]).backend, "backend")
