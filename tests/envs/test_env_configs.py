"""Every conf/env/*.yaml builds with hydra.utils.instantiate and solves a task with its own demo.

Generic on purpose: it uses only the EnvSpec API (rlkit.types) and, where the env declares one
(rlkit.types.SupportsDemonstrations), its solver's ``demonstration(seed)``, so a new env YAML is tested by
just existing. Every env also passes rlkit.env_check.check_env, the start-up check of the contract (observation
types, a step that never raises on malformed output); tests/envs/test_env_check.py shows what it refuses.
"""

import itertools
import json
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rlkit.env_check import check_env
from rlkit.types import EpisodeEnv, Observation, StepOutput, SupportsDemonstrations

CONF_ENV = Path(__file__).resolve().parents[2] / "conf" / "env"
ENV_YAMLS = sorted(CONF_ENV.glob("*.yaml"))


def test_env_configs_exist():
    assert ENV_YAMLS, f"no env configs under {CONF_ENV}"


def _solve(spec, seed: int) -> EpisodeEnv:
    env = spec.make()
    assert isinstance(env, EpisodeEnv)
    texts = spec.demonstration(seed)
    obs = env.reset(seed)
    assert isinstance(obs, Observation) and obs.text
    for turn, text in enumerate(texts[: spec.max_turns]):
        out = env.step(text)
        assert isinstance(out, StepOutput)
        json.dumps(out.info)
        assert out.info["parse_ok"] is True
        if out.done:
            break
        assert out.observation is not None
    return env


@pytest.mark.parametrize("path", ENV_YAMLS, ids=[p.stem for p in ENV_YAMLS])
def test_env_config_instantiates_and_solves(path):
    spec = instantiate(OmegaConf.load(path))
    check_env(spec)  # the contract, as train.py checks it at start-up (raises a one-line EnvContractError)
    assert isinstance(spec.max_turns, int) and spec.max_turns >= 1
    assert isinstance(spec.eval_set_name, str) and spec.eval_set_name
    eval_seeds = spec.eval_seeds()
    assert eval_seeds and all(spec.is_eval_seed(s) for s in eval_seeds)
    train_seed = next(s for s in itertools.count(len(eval_seeds)) if not spec.is_eval_seed(s))
    if not isinstance(spec, SupportsDemonstrations):  # no solver: the first observation must still be one
        assert isinstance(spec.make().reset(eval_seeds[0]), Observation)
        return
    for seed in (eval_seeds[0], train_seed):
        assert _solve(spec, seed).success(), f"{path.name}: demonstration of seed {seed} fails"


@pytest.mark.parametrize("path", ENV_YAMLS, ids=[p.stem for p in ENV_YAMLS])
def test_env_config_rejects_unknown_keys(path):
    cfg = OmegaConf.load(path)
    cfg.not_a_real_key = 1
    with pytest.raises(Exception, match="not_a_real_key"):
        instantiate(cfg)
