"""Fixtures for the serving tests: a small tiny-Qwen3-VL base, two trained-looking adapters, a run
directory with checkpoints, and a helper that serves them on 127.0.0.1 (one server per test module)."""

from __future__ import annotations

import contextlib
import shutil

import pytest
import torch

pytest.importorskip("fastapi", reason="serving needs fastapi, uvicorn and openai (see docs/serving.md)")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")

from tests.policy.conftest import TEST_SIZES, perturb_lora  # noqa: E402
from tests.conftest import TEST_DTYPE

#: API key of the test servers.
API_KEY = "test-key-123"


@pytest.fixture(scope="session")
def base_dir(tiny_test_ckpt):
    return tiny_test_ckpt


@pytest.fixture(scope="session")
def adapters(base_dir, tmp_path_factory):
    """Two adapters {"a": dir, "b": dir} on ``base_dir`` with different random LoRA weights (rank 4)."""
    from rlkit.policy import load_policy

    root = tmp_path_factory.mktemp("serve_adapters")
    out = {}
    for name, seed in (("a", 1), ("b", 2)):
        policy = load_policy(name="serve_test", path=str(base_dir), device="cpu", dtype=TEST_DTYPE,
                             lora={"rank": 4, "alpha": 8})
        perturb_lora(policy.model, seed, scale=1.0)
        policy.save_adapter(root / name)
        out[name] = root / name
    return out


@pytest.fixture(scope="session")
def run_dir(adapters, tmp_path_factory):
    """A run directory as train.py leaves it mid-run: .hydra/ and checkpoints step 1 (adapter a) and
    step 2 (adapter b, ``latest``), no final adapter/ yet."""
    from rlkit import checkpoint as ckpt

    run = tmp_path_factory.mktemp("serve_run") / "14-03-22"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("[]\n")
    for step, name in ((1, "a"), (2, "b")):
        ckpt.save(run / "checkpoints", step, lambda d, n=name: shutil.copytree(adapters[n], d / "adapter"))
    return run


@contextlib.contextmanager
def serving(base_dir, adapter_args, api_key=None, dtype=TEST_DTYPE, wrap_engine=None, **limits):
    """Serve ``adapter_args`` ("name=path" strings) on ``base_dir`` at 127.0.0.1:<free port> in ``dtype`` (float32
    by default, as the evaluation it is compared with: ``auto`` would be bfloat16 on a CPU with native bf16
    matmuls, whose results depend on the batch shape); yields the ServerThread (``.url``) and stops it on exit.
    wrap_engine: None, or a function of the host's engine returning the engine to serve with."""
    from rlkit.serve.app import ServerSettings, ServerThread, create_app
    from rlkit.serve.models import load_host, parse_adapter_arg
    from rlkit.serve.protocol import ServeLimits

    host = load_host({"name": "serve_test", "device": "cpu", "dtype": dtype}, [parse_adapter_arg(a) for a in adapter_args],
                     base=str(base_dir))
    if wrap_engine is not None:
        host.engine = wrap_engine(host.engine)
    app = create_app(host, ServerSettings(limits=ServeLimits(**limits), api_key=api_key))
    with ServerThread(app) as srv:
        yield srv
