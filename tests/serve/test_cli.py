"""Command-line tools around serving: adapter/base resolution, --print-vllm, serve.py errors, bench_serve.py."""

from __future__ import annotations

import json
import shlex

import pytest

from bench import bench_serve
from rlkit.serve.models import AdapterError, parse_adapter_arg, resolve_adapter_dir, resolve_base
from rlkit.serve.vllm import vllm_lora_rank

from .conftest import serving
from .test_play_eval import load_script


def test_adapter_resolution(adapters, run_dir, tmp_path):
    b = adapters["b"].resolve()
    a = adapters["a"].resolve()
    assert resolve_adapter_dir(adapters["a"]) == (a, None)
    # a run without a final adapter/: its latest checkpoint (step 2 holds b)
    for src in (run_dir, run_dir / "latest", run_dir / "checkpoints", run_dir / "checkpoints" / "latest"):
        path, run = resolve_adapter_dir(src)
        assert path == (run_dir / "checkpoints" / "step_000002" / "adapter").resolve() and run == run_dir.resolve()
        assert path.joinpath("adapter_model.safetensors").read_bytes() == b.joinpath("adapter_model.safetensors").read_bytes()
    path, _ = resolve_adapter_dir(run_dir / "checkpoints" / "step_000001")
    assert path.joinpath("adapter_model.safetensors").read_bytes() == a.joinpath("adapter_model.safetensors").read_bytes()
    spec = parse_adapter_arg(str(run_dir))
    assert spec.name == "14-03-22" and spec.run_dir == run_dir.resolve()
    assert parse_adapter_arg(f"mine={run_dir}/latest").name == "mine"
    with pytest.raises(AdapterError, match="no such file"):
        parse_adapter_arg(str(tmp_path / "missing"))
    with pytest.raises(AdapterError, match="not an adapter directory"):
        parse_adapter_arg(str(tmp_path))
    with pytest.raises(AdapterError, match="adapter name"):
        parse_adapter_arg(f"bad name={adapters['a']}")
    empty_run = tmp_path / "run"
    (empty_run / "checkpoints").mkdir(parents=True)
    with pytest.raises(AdapterError, match="no complete checkpoint"):
        parse_adapter_arg(str(empty_run))


def test_base_resolution(adapters, base_dir, tmp_path):
    specs = [parse_adapter_arg(f"a={adapters['a']}"), parse_adapter_arg(f"b={adapters['b']}")]
    assert resolve_base(None, specs) == str(base_dir.resolve())
    assert resolve_base(str(base_dir), specs) == str(base_dir)
    with pytest.raises(AdapterError, match="differs from the base"):
        resolve_base(str(tmp_path), specs)
    assert resolve_base(str(tmp_path), specs, allow_mismatch=True) == str(tmp_path)


def test_print_vllm(adapters, run_dir, capsys, monkeypatch):
    monkeypatch.setenv("MY_KEY", "secret-value")
    rc = load_script("serve").main(["--adapter", f"a={adapters['a']}", "--adapter", f"late={run_dir}/latest",
                                    "--max-model-len", "4096", "--max-images", "18", "--port", "8011",
                                    "--api-key-env", "MY_KEY", "--print-vllm"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "secret-value" not in out
    command = " ".join(line for line in out.splitlines() if not line.startswith("#")).replace("\\", " ")
    argv = shlex.split(command)
    assert argv[:3] == ["vllm", "serve", argv[2]] and argv[2].endswith("ckpt")  # the base the adapters recorded

    def flag(name: str) -> list[str]:
        i = argv.index(name)
        vals = []
        for v in argv[i + 1:]:
            if v.startswith("--"):
                break
            vals.append(v)
        return vals

    assert flag("--served-model-name") == ["base"] and flag("--port") == ["8011"]
    assert "--enable-lora" in argv and flag("--max-lora-rank") == ["8"] and flag("--max-loras") == ["2"]
    assert flag("--lora-modules") == [f"a={adapters['a'].resolve()}",
                                      f"late={(run_dir / 'checkpoints' / 'step_000002' / 'adapter').resolve()}"]
    assert flag("--max-model-len") == ["4096"]
    assert json.loads(flag("--limit-mm-per-prompt")[0]) == {"image": 18, "video": 0}
    assert flag("--generation-config") == ["vllm"] and flag("--api-key") == ["$MY_KEY"]
    assert [vllm_lora_rank(r) for r in (1, 8, 9, 32, 300, 512)] == [8, 8, 16, 32, 320, 512]


def test_serve_refuses_bad_input(tmp_path, adapters, capsys):
    serve = load_script("serve")
    assert serve.main(["--adapter", str(tmp_path / "nothing"), "--print-vllm"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert serve.main(["--adapter", f"x={adapters['a']}", "--adapter", f"x={adapters['b']}"]) == 2
    assert "unique" in capsys.readouterr().err
    assert serve.main(["--adapter", str(adapters["a"]), "--api-key-env", "RLKIT_TEST_UNSET_VAR", "--print-vllm"]) == 2
    assert serve.main(["policy.nosuchkey=1", "--print-vllm"]) == 2
    assert "do not compose" in capsys.readouterr().err


def test_bench_serve_against_a_server(base_dir, adapters, tmp_path):
    with serving(base_dir, [f"a={adapters['a']}"]) as srv:
        report = tmp_path / "bench.json"
        rc = bench_serve.main(["--url", f"{srv.url}/v1", "--model", "a", "--requests", "6",
                                              "--concurrency", "3", "--max-tokens", "8", "--json", str(report)])
    assert rc == 0
    r = json.loads(report.read_text())
    assert r["ok"] == 6 and r["errors"] == 0 and r["requests_per_s"] > 0
    assert 0 < r["latency_p50_s"] <= r["latency_p95_s"] <= r["latency_max_s"]


def test_a_run_composes_with_the_env_it_ran(tmp_path):
    # A run that took the default env records only its choice (.hydra/hydra.yaml), not an override; the
    # tools around it (serve, play, eval) compose that env, not today's default.
    from omegaconf import OmegaConf

    from rlkit.serve.config import compose

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create([]), run / ".hydra" / "overrides.yaml")
    OmegaConf.save(OmegaConf.create({"hydra": {"runtime": {"choices": {"env": "visgym"}}}}), run / ".hydra" / "hydra.yaml")
    cfg = compose([], run_dir=run)
    assert cfg.env.variant == "easy" and cfg.policy.tiny.image_max_pixels == 72 * 72
    assert compose(["env=visgym_small"], run_dir=run).env.variant == "small"  # the caller's choice wins
    assert compose([]).env.variant == "small"  # no run: today's default


def test_a_run_composes_with_the_search_path_it_ran_with(tmp_path):
    """A run of an experiment from a conf folder outside the clone: Hydra recorded the search path among the hydra
    overrides (.hydra/hydra.yaml), not the task overrides; the tools compose the run with it."""
    from omegaconf import OmegaConf

    from rlkit.serve.config import ConfigComposeError, compose, run_overrides

    conf = tmp_path / "my_task" / "conf"
    (conf / "experiment").mkdir(parents=True)
    (conf / "experiment" / "outside.yaml").write_text("# @package _global_\ndefaults:\n  - smoke\n\nsteps: 7\n")
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(["experiment=outside"]), run / ".hydra" / "overrides.yaml")
    search = f"hydra.searchpath=[file://{conf}]"
    OmegaConf.save(OmegaConf.create({"hydra": {"overrides": {"hydra": [f"hydra.run.dir={run}", search, "hydra.mode=RUN"],
                                                                "task": ["experiment=outside"]}}}),
                   run / ".hydra" / "hydra.yaml")
    assert run_overrides(run) == [search, "experiment=outside"]
    assert compose([], run_dir=run).steps == 7 and compose(["steps=3"], run_dir=run).steps == 3
    with pytest.raises(ConfigComposeError, match="outside"):
        compose(["experiment=outside"])  # what the tools did before: the clone's conf/ alone


@pytest.mark.dtype_sensitive
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_every_adapter_serves_its_file_values_whatever_the_base_dtype(base_dir, adapters, dtype):
    """Two float32 adapters on a base in ``dtype``: each live LoRA tensor holds the file's values in the dtype it is
    kept in, whichever adapter was loaded second. PEFT rounds a second adapter through a bfloat16 base's dtype
    before up-casting it, which the loader undoes (the first bf16 CPU this suite ran on refused adapter b)."""
    import torch
    from peft.utils import load_peft_weights

    from rlkit.serve.models import live_key, load_host

    host = load_host({"name": "serve_test", "device": "cpu", "dtype": dtype},
                     [parse_adapter_arg(f"a={adapters['a']}"), parse_adapter_arg(f"b={adapters['b']}")],
                     base=str(base_dir))
    params = dict(host.policy.model.named_parameters())
    assert next(p for n, p in params.items() if "lora_" not in n).dtype == getattr(torch, dtype)
    for name in ("a", "b"):
        internal = host.adapters[name].internal
        state = load_peft_weights(str(adapters[name]), device="cpu")
        assert len(state) > 0
        for key, tensor in state.items():
            live = params[live_key(key, internal)]
            assert torch.equal(live.detach(), tensor.to(live.dtype)), (name, key)
            if live.dtype == torch.float32:  # kept in float32 (PEFT's autocast): not rounded on the way in
                assert torch.equal(live.detach(), tensor)


def test_api_key_sources_follow_vllm(monkeypatch, adapters, capsys):
    """--api-key KEY (repeatable) wins over VLLM_API_KEY, as vllm serve's; --api-key-env VAR reads another variable;
    a printed vllm command never holds the key."""
    serve = load_script("serve")

    def keys(*argv):
        return serve.api_keys(serve.build_parser().parse_args(list(argv)))[0]

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert keys() is None
    assert keys("--api-key", "k1") == ("k1",) and keys("--api-key", "k1", "--api-key", "k2") == ("k1", "k2")
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert keys() == ("from-env",) and keys("--api-key", "k1") == ("k1",)
    monkeypatch.setenv("MY_KEY", "mine")
    assert keys("--api-key-env", "MY_KEY") == ("mine",)
    with pytest.raises(ValueError, match="both given"):
        keys("--api-key", "k1", "--api-key-env", "MY_KEY")
    with pytest.raises(ValueError, match="empty key"):
        keys("--api-key", "")
    monkeypatch.setenv("VLLM_API_KEY", "")  # an empty variable is no key, as vLLM reads it
    assert keys() is None

    for argv, var in ((["--api-key", "secret-flag"], "VLLM_API_KEY"), (["--api-key-env", "MY_KEY"], "MY_KEY")):
        assert serve.main(["--adapter", f"a={adapters['a']}", *argv, "--print-vllm"]) == 0
        out = capsys.readouterr().out
        assert "secret-flag" not in out and "mine" not in out
        assert f'--api-key "${var}"' in out
        assert ("export it with the value of --api-key" in out) == (var == "VLLM_API_KEY")
    assert serve.main(["--adapter", f"a={adapters['a']}", "--api-key", "k1", "--api-key", "k2", "--engine", "vllm",
                       "--print-vllm"]) == 2
    assert "give one --api-key" in capsys.readouterr().err
