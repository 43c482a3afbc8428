"""load_policy: the YAML configs, unknown keys, the Qwen3-VL-8B path offline, and that path on a local dir."""

from __future__ import annotations

import socket
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rlkit.policy import Policy, PolicyLoadError, PromptInput, SamplingParams, load_policy, make_engine

from .conftest import maze_image

CONF = Path(__file__).resolve().parents[2] / "conf" / "policy"


def _node(name: str, cache_dir: Path, **overrides):
    """conf/policy/<name>.yaml inside a root with ``paths.cache_dir`` (as conf/train.yaml has)."""
    root = OmegaConf.create({"paths": {"cache_dir": str(cache_dir)}, "policy": OmegaConf.load(CONF / f"{name}.yaml")})
    for k, v in overrides.items():
        OmegaConf.update(root, f"policy.{k}", v)
    return root.policy


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No network: HF offline mode, an empty HF cache, and any socket connect is an error."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))

    def _no_connect(*a, **k):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", _no_connect)


def test_all_policy_configs_have_exactly_load_policy_keys():
    import inspect

    from dataclasses import fields

    from rlkit.policy import PolicyConfig

    params = set(inspect.signature(load_policy).parameters) - {"base_path", "train_mode"}
    assert params == {f.name for f in fields(PolicyConfig)}
    for f in CONF.glob("*.yaml"):
        node = OmegaConf.load(f)
        assert node._target_ == "rlkit.policy.load_policy"
        assert set(node.keys()) - {"_target_"} == params, f.name


def test_tiny_vl_yaml_builds_and_caches(tmp_path):
    node = _node("tiny_vl", tmp_path)
    policy = instantiate(node, base_path=None, train_mode="full")  # how the SFT warm start calls it
    assert isinstance(policy, Policy) and not policy.is_lora
    n = policy.num_parameters()
    assert 1_000_000 < n["total"] < 5_000_000 and n["trainable"] == n["total"]
    assert list((tmp_path / "tiny_vl").glob("*/config.json"))  # built into paths.cache_dir/tiny_vl
    lora = instantiate(node, base_path=None, train_mode="lora")
    assert lora.is_lora and lora.model.peft_config["default"].r == 16
    tt = lora.chat.user_turn("Go.", [maze_image(0)])
    assert tt.input_ids.count(lora.chat.image_pad_id) == 81


def test_unknown_keys_fail(tmp_path):
    with pytest.raises(Exception, match="rnak"):
        instantiate(_node("tiny_vl", tmp_path, **{"lora.rnak": 3}))
    with pytest.raises(Exception, match="hiden"):
        instantiate(_node("tiny_vl", tmp_path, **{"tiny.text_hiden": 3}))
    with pytest.raises(Exception, match="colour"):
        instantiate(_node("tiny_vl", tmp_path, colour="red"))
    with pytest.raises(ValueError, match="both set"):
        load_policy(path="/x", tiny={})


@pytest.mark.parametrize("name,model", [("qwen3_vl_8b", "Qwen/Qwen3-VL-8B-Instruct"), ("qwen3_vl_2b", "Qwen/Qwen3-VL-2B-Instruct")])
def test_hub_model_offline_fails_clearly(offline, tmp_path, name, model):
    with pytest.raises(Exception) as err:
        instantiate(_node(name, tmp_path))  # Hydra wraps the error; the cause is ours
    assert isinstance(err.value.__cause__, PolicyLoadError)
    msg = str(err.value.__cause__)
    for needle in (model, "policy.path", "HF_HOME", "HF_HUB_OFFLINE", "GPU"):
        assert needle in msg, (needle, msg)


def test_missing_local_dir_fails_clearly(tmp_path):
    with pytest.raises(PolicyLoadError, match="does not exist"):
        load_policy(path=str(tmp_path / "nope"))


def test_8b_config_runs_on_local_tiny_checkpoint(offline, tiny_dir, tmp_path):
    """Same loader as the 8B (bf16, LoRA r32/a64, gradient checkpointing), pointed at a local dir."""
    policy = instantiate(_node("qwen3_vl_8b", tmp_path, path=str(tiny_dir)))
    assert policy.dtype == torch.bfloat16 and policy.is_lora
    cfg = policy.model.peft_config["default"]
    assert cfg.r == 32 and cfg.lora_alpha == 64
    tt = policy.chat.user_turn("Which way?", [maze_image(4)], system="Solve.")
    out = make_engine(policy).generate(
        [PromptInput(tt.input_ids, **policy.chat.concat_images(tt.image_inputs))],
        SamplingParams(temperature=1.0, max_new_tokens=4, n=2, seed=0),
    )
    assert len(out[0]) == 2 and all(len(c.logprobs) == len(c.token_ids) for c in out[0])
    seq = PromptInput(tt.input_ids + out[0][0].token_ids, **policy.chat.concat_images(tt.image_inputs))
    lp, _ = policy.logprobs([seq], temperature=1.0)
    gen = torch.tensor(out[0][0].logprobs)
    assert (lp[0, len(tt.input_ids):].float() - gen).abs().max() < 0.1  # bf16: loose


def test_large_model_refused_on_cpu(monkeypatch, tiny_dir):
    import rlkit.policy.policy as pp

    monkeypatch.setattr(pp, "MAX_CPU_PARAMS", 1000)
    with pytest.raises(PolicyLoadError, match="GPU"):
        load_policy(path=str(tiny_dir), device="cpu")


def test_unresolvable_hub_fails_before_any_hub_request(monkeypatch, tmp_path):
    """Not cached + the hub's host does not resolve: the clear error comes at once, without the
    ~30 s of huggingface_hub retries (AutoConfig is never asked)."""
    import socket

    import transformers
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hf-cache"))

    def no_dns(*a, **k):
        raise socket.gaierror(-2, "Name or service not known")

    def never(*a, **k):
        raise AssertionError("AutoConfig.from_pretrained must not be reached")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", never)
    with pytest.raises(PolicyLoadError, match="does not resolve") as err:
        load_policy(name="qwen3_vl_8b", path="Qwen/Qwen3-VL-8B-Instruct", tiny=None)
    assert "policy.path" in str(err.value) and "HF_HUB_OFFLINE" in str(err.value)
