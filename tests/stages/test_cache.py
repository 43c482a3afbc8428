"""The SFT warm start's cache key depends on content, not on where the cache or checkpoint lives."""

import shutil

import pytest
from omegaconf import OmegaConf

from rlkit.stages.cache import sft_cache_key

SFT = OmegaConf.create({"lr": 1e-3, "max_steps": 10, "seed": 1234})
ENV = OmegaConf.create({"_target_": "envs.visgym.VisGymMaze", "variant": "easy", "mode": "plan"})


def _policy(**kw):
    return OmegaConf.create({"_target_": "rlkit.policy.load_policy", "name": "tiny_vl", "path": None,
                             "tiny": {"text_hidden": 64}, "cache_dir": "/home/a/.cache/tiny_vl", **kw})


def test_cache_location_is_not_part_of_the_key():
    a = sft_cache_key(SFT, ENV, _policy(cache_dir="/home/a/.cache/tiny_vl"))
    b = sft_cache_key(SFT, ENV, _policy(cache_dir="/shared/rlkit-cache/tiny_vl"))
    assert a == b
    assert sft_cache_key(OmegaConf.merge(SFT, {"lr": 2e-3}), ENV, _policy()) != a  # content still counts
    assert sft_cache_key(SFT, ENV, _policy(tiny={"text_hidden": 32})) != a


def test_the_grpo_adapter_settings_do_not_rebuild_the_warm_start():
    """The warm start trains all weights; a sweep over policy.lora.* shares it (the dtype does not)."""
    a = sft_cache_key(SFT, ENV, _policy(lora={"rank": 16, "alpha": 32}))
    assert sft_cache_key(SFT, ENV, _policy(lora={"rank": 64, "alpha": 128, "include_vision": True})) == a
    assert sft_cache_key(SFT, ENV, _policy(lora={"rank": 16}, dtype="float32")) != \
        sft_cache_key(SFT, ENV, _policy(lora={"rank": 16}, dtype="bfloat16"))


def test_a_copied_checkpoint_keys_the_same(tmp_path):
    src = tmp_path / "one" / "ckpt"
    src.mkdir(parents=True)
    (src / "config.json").write_text('{"hidden": 8}')
    (src / "model.safetensors").write_bytes(b"\0" * 2_000_000)
    dst = tmp_path / "elsewhere" / "ckpt"
    shutil.copytree(src, dst)
    key = sft_cache_key(SFT, ENV, _policy(path=str(src)))
    assert sft_cache_key(SFT, ENV, _policy(path=str(dst))) == key
    (dst / "config.json").write_text('{"hidden": 16}')
    assert sft_cache_key(SFT, ENV, _policy(path=str(dst))) != key


def test_the_validation_decoding_is_part_of_the_key():
    """The stage stops at a greedy val success decoded with rollout.max_new_tokens and rollout.stop: a run
    with other values must not reuse a warm start stopped under the old ones."""
    plain = sft_cache_key(SFT, ENV, _policy())
    key = sft_cache_key(SFT, ENV, _policy(), {"max_new_tokens": 48, "stop": ["</answer>"]})
    assert key != plain
    assert sft_cache_key(SFT, ENV, _policy(), {"max_new_tokens": 48, "stop": ["</answer>"]}) == key
    assert sft_cache_key(SFT, ENV, _policy(), {"max_new_tokens": 24, "stop": ["</answer>"]}) != key
    assert sft_cache_key(SFT, ENV, _policy(), {"max_new_tokens": 48, "stop": []}) != key


def test_grounding_mix_off_keys_as_before_the_option_existed():
    from rlkit.stages.sft import sft_stage_config

    before = sft_cache_key(SFT, ENV, _policy())
    assert sft_cache_key(sft_stage_config(OmegaConf.merge(SFT, {"grounding_mix": 0})), ENV, _policy()) == before
    assert sft_cache_key(sft_stage_config(OmegaConf.merge(SFT, {"grounding_mix": 8})), ENV, _policy()) != before


def test_constant_lr_schedule_keys_as_before_the_option_existed():
    from rlkit.stages.sft import sft_stage_config

    before = sft_cache_key(SFT, ENV, _policy())
    assert sft_cache_key(sft_stage_config(OmegaConf.merge(SFT, {"lr_schedule": "constant"})), ENV, _policy()) == before
    assert sft_cache_key(sft_stage_config(OmegaConf.merge(SFT, {"lr_schedule": "cosine"})), ENV, _policy()) != before


@pytest.mark.parametrize("key, value", [("train_room_endpoints", 0.0), ("train_open_passage", 0.0),
                                        ("route_context", "picture")])
def test_a_removed_env_key_at_todays_behaviour_keys_as_today(key, value):
    """An older run's env config still holds a removed lever's key (conf/compat.yaml, removed) at the value
    under which builds drew what they draw now: it finds the entries built without the key."""
    before = sft_cache_key(SFT, ENV, _policy())
    assert sft_cache_key(SFT, OmegaConf.merge(ENV, {key: value}), _policy()) == before


def test_the_layout_holdout_keys_as_before_the_option_existed():
    before = sft_cache_key(SFT, ENV, _policy())
    assert sft_cache_key(SFT, OmegaConf.merge(ENV, {"holdout": "layout"}), _policy()) == before
    assert sft_cache_key(SFT, OmegaConf.merge(ENV, {"holdout": "dihedral"}), _policy()) != before


def test_a_checkpoint_overwritten_in_place_with_same_size_weights_keys_anew(tmp_path, monkeypatch):
    """policy.path=<a folder retrained in place>: the warm start built on the old weights must not be reused."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"hidden": 8}')
    (ckpt / "model.safetensors").write_bytes(b"\0" * 2_000_000)
    key = sft_cache_key(SFT, ENV, _policy(path=str(ckpt)))
    (ckpt / "model.safetensors").write_bytes(b"\0" * 1_000_000 + b"\1" + b"\0" * 999_999)  # same name and size
    assert sft_cache_key(SFT, ENV, _policy(path=str(ckpt))) != key
    # a shard above the whole-file size is read by chunks: a change in its first or last MiB counts too
    import rlkit.stages.cache

    monkeypatch.setattr(rlkit.stages.cache, "_WHOLE_FILE_BYTES", 1 << 20)
    shard = bytearray(5 << 20)
    (ckpt / "model.safetensors").write_bytes(bytes(shard))
    key = sft_cache_key(SFT, ENV, _policy(path=str(ckpt)))
    shard[-1] = 7
    (ckpt / "model.safetensors").write_bytes(bytes(shard))
    assert sft_cache_key(SFT, ENV, _policy(path=str(ckpt))) != key
    assert rlkit.stages.cache.checkpoint_fingerprint(ckpt) == rlkit.stages.cache.checkpoint_fingerprint(ckpt)  # stable


def test_recovery_share_off_keys_as_before_the_option_existed():
    from rlkit.stages.sft import sft_stage_config

    before = sft_cache_key(SFT, ENV, _policy())
    assert sft_cache_key(sft_stage_config(OmegaConf.merge(SFT, {"recovery_share": 0.0})), ENV, _policy()) == before
    assert sft_cache_key(sft_stage_config(OmegaConf.merge(SFT, {"recovery_share": 0.5})), ENV, _policy()) != before


def test_the_prompt_fingerprint_hashes_the_recovery_demonstrations_only_when_a_stage_learns_them(monkeypatch):
    """A stage with sft.recovery_share > 0 is keyed by the env's recovery code too (a change to how mistakes are drawn
    rebuilds it); one without keys as before recovery demonstrations existed."""
    import envs.visgym.spec as spec_mod
    from envs.visgym import VisGymMaze
    from rlkit.stages.cache import prompt_fingerprint

    env = VisGymMaze(variant="small", mode="interactive", parser="tuple", max_turns=17)
    plain, recovery = prompt_fingerprint(env), prompt_fingerprint(env, recovery=True)
    assert plain != recovery
    real = spec_mod.recovery_texts
    monkeypatch.setattr(spec_mod, "recovery_texts",
                        lambda *a, **k: [(text, True) for text, _ in real(*a, **k)])  # the mistake learned too
    assert prompt_fingerprint(env) == plain and prompt_fingerprint(env, recovery=True) != recovery
    with pytest.raises(TypeError, match="recovery_share=0"):
        prompt_fingerprint(_NoRecovery(env), recovery=True)


class _NoRecovery:
    """An env spec with demonstrations and no recovery_demonstration."""

    def __init__(self, env):
        self._env = env

    def make(self):
        return self._env.make()

    def eval_seeds(self):
        return self._env.eval_seeds()

    def demonstration(self, seed):
        return self._env.demonstration(seed)
