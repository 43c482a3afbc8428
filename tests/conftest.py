import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# The suite's subprocesses (train.py, the user tools of scripts/, bench/) import this checkout's rlkit, not the checkout
# an editable .venv was installed from: scripts/ has no sys.path preamble.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

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
    test that seeds them (GRPORecipe.setup does, as train.py needs) must not make another test's draws
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


# -- the core loop's fixtures (recipes, sampling, stages, algorithms, update) -------------------------
@pytest.fixture(scope="session")
def small_ckpt(tiny_test_ckpt):
    return tiny_test_ckpt


@pytest.fixture
def policy(small_ckpt):
    from rlkit.policy import load_policy

    return load_policy(name="core_test", path=str(small_ckpt), device="cpu", dtype=TEST_DTYPE,
                       lora={"rank": 8, "alpha": 16})


@pytest.fixture
def full_policy(small_ckpt):
    """The small checkpoint with every weight trainable, as the one-time builds (grounding, warm start) train it."""
    from rlkit.policy import load_policy

    return load_policy(name="full_test", path=str(small_ckpt), device="cpu", dtype=TEST_DTYPE, lora={"enabled": False})


@pytest.fixture
def nll_batches(monkeypatch):
    """The list of every batch the SFT warm start (rlkit.stages.sft) calls ``demonstration_nll`` with from here
    on, in order (the calls still compute their loss)."""
    import rlkit.stages.sft as sft_mod

    batches, real = [], sft_mod.demonstration_nll

    def spy(policy, demonstrations, shared_prefix=None):
        batches.append(list(demonstrations))
        return real(policy, demonstrations, shared_prefix=shared_prefix)

    monkeypatch.setattr(sft_mod, "demonstration_nll", spy)
    return batches


@pytest.fixture
def plan_env():
    from envs.visgym import VisGymMaze

    return VisGymMaze(variant="easy", mode="plan", parser="plan", max_turns=18)


@pytest.fixture
def interactive_env():
    from envs.visgym import VisGymMaze

    return VisGymMaze(variant="easy", mode="interactive", parser="tuple", max_turns=3)


# -- durations on record ---------------------------------------------------------------------------
# RLKIT_DURATIONS_FILE=<path> (scripts/test.sh sets it): at the end of the session the 25 slowest tests
# (setup + call + teardown seconds) are written to <path> (relative: to the repo root; "1": tests/durations.txt),
# one "<seconds> <outcome> <node id>" line each, slowest first, so a test that gets slower shows in the diff of
# that file. Under pytest-xdist only the controller writes: the workers' reports reach its
# pytest_runtest_logreport too.
DURATIONS_KEPT = 25
_DURATIONS: dict[str, list] = {}  # node id -> [seconds, outcome]


def durations_path(value: str | None) -> Path | None:
    """Where RLKIT_DURATIONS_FILE's ``value`` asks the durations to go (None: not asked)."""
    if not value or value.strip().lower() in ("0", "false", "no"):
        return None
    if value.strip().lower() in ("1", "true", "yes"):
        return ROOT / "tests" / "durations.txt"
    path = Path(value).expanduser()
    return path if path.is_absolute() else ROOT / path


def format_durations(durations: dict[str, list], keep: int = DURATIONS_KEPT) -> str:
    """The ``keep`` slowest entries of ``durations`` (node id -> [seconds, outcome]) as lines, slowest first
    (ties by node id, so the file is stable)."""
    rows = sorted(durations.items(), key=lambda kv: (-kv[1][0], kv[0]))[:keep]
    return "".join(f"{secs:9.2f}s {outcome:<7} {nodeid}\n" for nodeid, (secs, outcome) in rows)


def pytest_runtest_logreport(report):
    entry = _DURATIONS.setdefault(report.nodeid, [0.0, "passed"])
    entry[0] += float(getattr(report, "duration", 0.0) or 0.0)
    if report.failed:
        entry[1] = "failed"
    elif report.skipped and entry[1] == "passed":
        entry[1] = "skipped"


def _write_durations(session) -> None:
    path = durations_path(os.environ.get("RLKIT_DURATIONS_FILE"))
    if path is None or hasattr(session.config, "workerinput") or not _DURATIONS:  # an xdist worker: not its job
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_durations(_DURATIONS))


# -- exit ------------------------------------------------------------------------------------------
# One fresh-clone CI run (of three on the same tests) passed every test, printed its summary, and
# then the interpreter died with SIGSEGV while finalizing (no pytest traceback: it was after pytest
# had finished), so .ci/run failed with 139. A crash in a C extension's teardown at exit is not a
# test result: once pytest has reported, leave without finalizing, with pytest's own exit status.
# RLKIT_TEST_HARD_EXIT=0 restores the normal exit (to look for that crash).
_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _write_durations(session)
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if _EXIT_STATUS and os.environ.get("RLKIT_TEST_HARD_EXIT", "1") != "0":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
