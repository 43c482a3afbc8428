"""policy.dtype=auto: the CPU/GPU resolution (rlkit.hardware), its single resolution in a run (rlkit.run), the
build cache keys it gives, and the refusal of unknown values."""

import pytest
import torch
from omegaconf import OmegaConf

from rlkit.hardware import (OVERRIDE_ENV, cpu_info, native_bf16, parse_cpuinfo, resolve_dtype, resolve_dtype_here,
                            this_cpu_has_native_bf16)
from rlkit.run import compose_train, policy_device_type, resolve_policy_dtype
from rlkit.stages.cache import cache_key_inputs, sft_cache_key

pytestmark = pytest.mark.dtype_sensitive

AVX2 = {"fpu", "sse2", "avx", "avx2", "fma"}  # Zen 3: no AVX-512 at all
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni"}  # Ice Lake: AVX-512 without bf16
COOPER = AVX512 | {"avx512_bf16"}
SAPPHIRE = COOPER | {"amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize("flags, arch, device, expected", [
    (AVX2, "x86_64", "cpu", "float32"),
    (AVX512, "x86_64", "cpu", "float32"),  # avx512f alone does not make bf16 native
    (COOPER, "x86_64", "cpu", "bfloat16"),
    (SAPPHIRE, "x86_64", "cpu", "bfloat16"),
    ({"avx2", "amx_bf16"}, "x86_64", "cpu", "bfloat16"),
    (AVX2, "x86_64", "cuda", "bfloat16"),  # CUDA keeps bf16 whatever the host CPU
    (set(), "x86_64", "cuda", "bfloat16"),
    ({"fp", "asimd", "sve", "bf16", "i8mm"}, "aarch64", "cpu", "bfloat16"),  # Graviton3 / Neoverse V1
    ({"fp", "asimd", "atomics"}, "aarch64", "cpu", "float32"),  # Graviton2 / Neoverse N1
    ({"bf16"}, "arm64", "cpu", "bfloat16"),
    ({"bf16"}, "x86_64", "cpu", "float32"),  # the arm name means nothing on x86
    ({"avx512_bf16"}, "aarch64", "cpu", "float32"),
    ({"avx512_bf16"}, "riscv64", "cpu", "float32"),
])
def test_auto_resolves_by_device_and_cpu_flags(flags, arch, device, expected):
    dtype, reason = resolve_dtype("auto", device, flags, arch)
    assert dtype == expected
    if device == "cpu":
        assert native_bf16(flags, arch) == (expected == "bfloat16")
    if device == "cuda":
        assert reason == "CUDA"
    elif expected == "bfloat16":
        assert reason.startswith("this CPU has native bf16 matmuls: ")
    else:
        assert "no native bf16 matmuls" in reason


def test_the_reason_names_the_flags():
    assert resolve_dtype("auto", "cpu", AVX2)[1] == "this CPU has no native bf16 matmuls: avx512_bf16/amx_bf16 absent"
    assert resolve_dtype("auto", "cpu", SAPPHIRE)[1] == "this CPU has native bf16 matmuls: avx512_bf16/amx_bf16"
    assert resolve_dtype("auto", "cpu", {"bf16"}, "aarch64")[1] == "this CPU has native bf16 matmuls: bf16"
    assert resolve_dtype("auto", "cpu", {"asimd"}, "aarch64")[1] == \
        "this CPU has no native bf16 matmuls: the aarch64 bf16 feature is absent"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_an_explicit_dtype_is_kept_everywhere(dtype):
    for device, flags in (("cpu", AVX2), ("cpu", SAPPHIRE), ("cuda", AVX2)):
        assert resolve_dtype(dtype, device, flags) == (dtype, "set explicitly")


@pytest.mark.parametrize("bad", ["bf16", "fp32", "Auto", "float64", ""])
def test_an_unknown_dtype_is_refused_naming_the_allowed_values(bad):
    with pytest.raises(ValueError, match=r"expected one of auto, float32, bfloat16, float16"):
        resolve_dtype(bad, "cpu", AVX2)
    from rlkit.policy import PolicyConfig

    with pytest.raises(ValueError, match=rf"policy.dtype='{bad}': expected one of auto, float32, bfloat16, float16"):
        PolicyConfig.from_dict({"tiny": {}, "dtype": bad})


def test_cpuinfo_is_parsed_on_x86_and_aarch64():
    x86 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 avx512f avx512_bf16\n\n"
           "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
    info = parse_cpuinfo(x86, "x86_64")
    assert info.model == "AMD EPYC 7B13" and info.flags == {"fpu", "avx2", "avx512f", "avx512_bf16"}
    assert native_bf16(info.flags, info.arch)
    arm = "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd evtstrm aes bf16 i8mm\nCPU part\t: 0xd40\n"
    info = parse_cpuinfo(arm, "aarch64")
    assert info.model == "" and "bf16" in info.flags and native_bf16(info.flags, info.arch)


def test_the_override_env_var_forces_the_cpu_class(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    assert this_cpu_has_native_bf16() and resolve_dtype_here("auto", "cpu") == ("bfloat16", f"{OVERRIDE_ENV}=1")
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    assert not this_cpu_has_native_bf16() and resolve_dtype_here("auto", "cpu") == ("float32", f"{OVERRIDE_ENV}=0")
    assert resolve_dtype_here("auto", "cuda") == ("bfloat16", "CUDA")
    monkeypatch.setenv(OVERRIDE_ENV, "yes")
    with pytest.raises(ValueError, match=f"{OVERRIDE_ENV}='yes': expected 1"):
        resolve_dtype_here("auto", "cpu")
    monkeypatch.delenv(OVERRIDE_ENV)
    info = cpu_info()
    assert this_cpu_has_native_bf16() == native_bf16(info.flags, info.arch)


@pytest.mark.parametrize("forced, torch_dtype", [("1", torch.bfloat16), ("0", torch.float32)])
def test_policy_config_resolves_auto_as_the_run_does(monkeypatch, forced, torch_dtype):
    """load_policy's own resolution (scripts/eval.py, serve, Ray workers given an unresolved config)."""
    from rlkit.policy import PolicyConfig

    monkeypatch.setenv(OVERRIDE_ENV, forced)
    pc = PolicyConfig.from_dict({"tiny": {}, "dtype": "auto"})
    assert pc.resolve_dtype(torch.device("cpu")) == torch_dtype
    assert pc.resolve_dtype(torch.device("cuda")) == torch.bfloat16
    assert PolicyConfig.from_dict({"tiny": {}, "dtype": "float32"}).resolve_dtype(torch.device("cuda")) == torch.float32


def test_explicit_bf16_without_native_bf16_runs_with_the_warning(monkeypatch, caplog):
    from rlkit.policy import PolicyConfig

    monkeypatch.setenv(OVERRIDE_ENV, "0")
    with caplog.at_level("WARNING", logger="rlkit.policy.policy"):
        assert PolicyConfig.from_dict({"tiny": {}, "dtype": "bfloat16"}).resolve_dtype(torch.device("cpu")) == torch.bfloat16
    assert "emulated and slower than float32" in caplog.text
    caplog.clear()
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    with caplog.at_level("WARNING", logger="rlkit.policy.policy"):
        PolicyConfig.from_dict({"tiny": {}, "dtype": "bfloat16"}).resolve_dtype(torch.device("cpu"))
    assert caplog.text == ""


def _compose(*overrides, resolve_dtype=True):
    """compose_train with the ``paths`` a job gets from Hydra (``${hydra:...}`` resolves only inside one)."""
    return compose_train(["paths.output_dir=/tmp/out", "paths.cache_dir=/tmp/cache", "paths.shared=/tmp/shared",
                          *overrides], resolve_dtype=resolve_dtype)


def test_the_tiny_default_is_auto_and_compose_train_resolves_it(monkeypatch):
    """compose_train gives the config as a train.py job sees it (a chained warm start composes its job with it, and
    must key that job's builds as the job run by itself does)."""
    assert compose_train([], resolve_dtype=False).policy.dtype == "auto"
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    assert compose_train(["policy.device=cpu"]).policy.dtype == "bfloat16"
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    assert compose_train(["policy.device=cpu"]).policy.dtype == "float32"
    assert compose_train(["policy.device=cpu", "policy.dtype=bfloat16"]).policy.dtype == "bfloat16"


@pytest.mark.parametrize("forced, dtype", [("1", "bfloat16"), ("0", "float32")])
def test_auto_in_a_composed_config_keys_the_builds_as_the_explicit_dtype(monkeypatch, forced, dtype):
    """A warm start built with an explicit ``policy.dtype=bfloat16`` (the tiny default before auto) is found again
    when auto resolves to bfloat16: the resolved config hashes byte for byte as the explicit one."""
    monkeypatch.setenv(OVERRIDE_ENV, forced)
    auto = _compose("policy.device=cpu", resolve_dtype=False)
    assert resolve_policy_dtype(auto) == (dtype, f"{OVERRIDE_ENV}={forced}")
    assert auto.policy.dtype == dtype and resolve_policy_dtype(auto) is None  # once: nothing left to resolve
    explicit = _compose("policy.device=cpu", f"policy.dtype={dtype}")
    assert OmegaConf.to_container(auto.policy, resolve=True) == OmegaConf.to_container(explicit.policy, resolve=True)
    assert cache_key_inputs(auto.sft, auto.env, auto.policy) == cache_key_inputs(explicit.sft, explicit.env, explicit.policy)
    assert sft_cache_key(auto.grounding, auto.env, auto.policy) == sft_cache_key(explicit.grounding, explicit.env,
                                                                                 explicit.policy)
    other = _compose("policy.device=cpu", f"policy.dtype={'float32' if dtype == 'bfloat16' else 'bfloat16'}")
    assert sft_cache_key(auto.sft, auto.env, auto.policy) != sft_cache_key(other.sft, other.env, other.policy)
    unresolved = _compose("policy.device=cpu", resolve_dtype=False)
    assert sft_cache_key(auto.sft, auto.env, auto.policy) != sft_cache_key(unresolved.sft, unresolved.env,
                                                                           unresolved.policy)


def test_the_device_a_run_trains_on(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    assert policy_device_type(_compose("policy.device=cpu")) == "cpu"
    assert policy_device_type(compose_train(["policy.device=cuda"])) == "cuda"
    # Ray workers: their GPUs decide, not the driver's
    ray = compose_train(["backend=native_ray", "backend.gpus_per_worker=1"], resolve_dtype=False)
    assert policy_device_type(ray) == "cuda" and resolve_policy_dtype(ray)[0] == "bfloat16"
    assert policy_device_type(compose_train(["backend=native_ray", "backend.gpus_per_worker=0"])) == "cpu"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert policy_device_type(compose_train([])) == expected


def test_skyrl_resolves_auto_to_bf16_on_this_cpu_too(monkeypatch):
    """backend=skyrl trains on GPUs (backend.gpus_per_node): auto is bfloat16 even where the driver's CPU has no
    native bf16, and its compiler accepts auto and bfloat16 only."""
    monkeypatch.setenv(OVERRIDE_ENV, "0")
    from tests.backends.conftest import compose_cfg
    from tests.backends.test_skyrl_config import _backend

    cfg = compose_cfg(["experiment=hyperpod_visgym", "policy.dtype=auto"])
    assert resolve_policy_dtype(cfg) == ("bfloat16", "CUDA") and cfg.policy.dtype == "bfloat16"
    job = _backend(cfg).compile(cfg)
    assert job.config["trainer"]["bf16"] is True
    assert job.config["generator"]["inference_engine"]["model_dtype"] == "bfloat16"
    _backend(cfg).compile(compose_cfg(["experiment=hyperpod_visgym", "policy.dtype=auto"]))  # unresolved: accepted
    from rlkit.backends.skyrl import SkyRLConfigError

    with pytest.raises(SkyRLConfigError, match="policy.dtype=float32: SkyRL trains in bf16"):
        _backend(cfg).compile(compose_cfg(["experiment=hyperpod_visgym", "policy.dtype=float32"]))


class StubBackend:
    """A backend that records the dtype it was handed (run() calls ``run(cfg)``)."""

    def run(self, cfg):
        return {"dtype": cfg.policy.dtype}


def test_run_resolves_once_prints_it_and_records_it(tmp_path, monkeypatch, capsys):
    from rlkit.run import run

    monkeypatch.setenv(OVERRIDE_ENV, "0")
    cfg = compose_train(["policy.device=cpu", f"paths.output_dir={tmp_path}", f"paths.cache_dir={tmp_path / 'cache'}",
                         f"paths.shared={tmp_path / 'shared'}"], resolve_dtype=False)
    cfg.backend = OmegaConf.create({"_target_": f"{__name__}.StubBackend"})
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))  # as Hydra writes it: auto
    assert run(cfg) == {"dtype": "float32"}
    assert f"[rlkit] policy.dtype=auto -> float32 ({OVERRIDE_ENV}=0)" in capsys.readouterr().out
    saved = OmegaConf.load(tmp_path / ".hydra" / "config.yaml")
    assert saved.policy.dtype == "float32" and saved.policy.tiny == cfg.policy.tiny
    explicit = compose_train(["policy.device=cpu", "policy.dtype=bfloat16", f"paths.output_dir={tmp_path}"])
    explicit.backend = OmegaConf.create({"_target_": f"{__name__}.StubBackend"})
    assert run(explicit) == {"dtype": "bfloat16"}  # explicit: kept, nothing printed
    assert "policy.dtype=auto" not in capsys.readouterr().out
