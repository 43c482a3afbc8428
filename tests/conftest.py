import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# The builds (trainer.build_threads=null) take $OMP_NUM_THREADS threads: 1 in the suite, whose train.py
# subprocesses run beside other work and build only smoke-sized warm starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


#: A small tiny-Qwen3-VL (smaller than conf/policy/tiny_vl.yaml) so suites stay fast on 2 CPU cores.
TINY_TEST_SIZES = dict(
    text_hidden=64, text_layers=2, text_heads=2, text_kv_heads=1, head_dim=32, text_intermediate=128,
    vision_hidden=32, vision_depth=2, vision_heads=1, vision_intermediate=64, deepstack_indexes=[1],
)


#: The dtype of the tests that load a TINY_TEST_SIZES checkpoint directly to check code paths (the engine against
#: the training forward, the shared prefix, exact resume, weight sync) at float32 tolerances. They ran in float32
#: on every CPU while ``policy.dtype=auto`` meant float32 on CPU; auto now means bf16 on a CPU with native bf16
#: matmuls (rlkit.hardware), so they name float32. Tests of the composed config (conf/policy/tiny_vl.yaml) run
#: in the dtype auto resolves to, as the job does; tests about bf16 name bfloat16.
TEST_DTYPE = "float32"


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # One intra-op thread: the models here are tiny, and on a shared 2-core machine a 2-thread
    # OpenMP pool waiting for a busy core makes a small matmul ~100x slower than one thread.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _global_rngs_restored():
    """Each test leaves Python's, NumPy's and torch's global random generators as it found them: code under
    test that seeds them (NativeRun.setup does, as train.py needs) must not make another test's draws
    depend on the order the tests run in."""
    import random

    import numpy as np

    state = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None  # the GPU checks' runs
    yield
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


@pytest.fixture(scope="session")
def tiny_test_ckpt(tmp_path_factory) -> Path:
    """One checkpoint of TINY_TEST_SIZES for the whole session (built offline, ~1 s; read-only)."""
    from rlkit.policy.tiny import TinyVLSizes, build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("tiny_test") / "ckpt", TinyVLSizes(**TINY_TEST_SIZES), seed=0)


# -- exit ------------------------------------------------------------------------------------------
# One fresh-clone CI run (of three on the same tests) passed every test, printed its summary, and
# then the interpreter died with SIGSEGV while finalizing (no pytest traceback: it was after pytest
# had finished), so .ci/run failed with 139. A crash in a C extension's teardown at exit is not a
# test result: once pytest has reported, leave without finalizing, with pytest's own exit status.
# RLKIT_TEST_HARD_EXIT=0 restores the normal exit (to look for that crash).
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if _EXIT_STATUS and os.environ.get("RLKIT_TEST_HARD_EXIT", "1") != "0":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
