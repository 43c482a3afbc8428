"""The executor contract (rlkit.recipes.executor.Executor) is what the recipe calls, and both executors keep it.

Read from the source and the classes, without starting either executor: every member the recipe (grpo.py) and the
healing loop (heal.py) use on their executor is in the protocol; LocalExecutor and RayExecutor have every member,
each method with the protocol's parameters (names, kinds, defaults), each attribute set by the class; their
``policy`` keeps AdapterHolder's. And (``-m slow``, it starts Ray) a 2-step smoke run of each gives the same metrics."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from rlkit.policy.policy import Policy
from rlkit.recipes.executor import AdapterHolder, Executor
from rlkit.recipes.local import LocalExecutor
from rlkit.recipes.ray import RayExecutor, RemotePolicy

RECIPES = Path(__file__).resolve().parents[2] / "rlkit" / "recipes"


def _methods(proto: type) -> dict[str, object]:
    return {n: f for n, f in vars(proto).items() if inspect.isfunction(f) and not n.startswith("_")}


def _members(proto: type) -> set[str]:
    return set(_methods(proto)) | set(proto.__annotations__)


def _params(f: object) -> list[tuple[str, object, object]]:
    """(name, kind, default) of each parameter: what a caller relies on (annotations may narrow ``Any``)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]


def _assigned(cls: type) -> set[str]:
    """Attributes a class sets: its class-level names and every ``self.<name> = ...`` in its methods."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    out = {n for n in vars(cls) if not n.startswith("__")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        else:
            targets = [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            for e in ast.walk(t):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    out.add(e.attr)
    return out


def _used_on(path: Path, names: tuple[str, ...]) -> set[str]:
    """The attributes read on ``self.executor`` / ``executor`` in a module."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        on_self = isinstance(v, ast.Attribute) and v.attr in names and isinstance(v.value, ast.Name) and v.value.id == "self"
        if on_self or (isinstance(v, ast.Name) and v.id in names):
            out.add(node.attr)
    return out


def test_the_recipe_and_healing_use_only_the_contract():
    # the recipe, its healing and its pipelining (the update with the next step sampled meanwhile)
    used = set().union(*(_used_on(RECIPES / m, ("executor",)) for m in ("grpo.py", "heal.py", "pipeline.py")))
    assert used, "the recipe's executor calls were not found"
    assert used - _members(Executor) == set(), "called on the executor but not in rlkit.recipes.executor.Executor"
    assert {"sample_with", "settle", "start_update", "finish_update", "evaluate"} <= used


@pytest.mark.parametrize("cls", [LocalExecutor, RayExecutor])
def test_each_executor_has_every_member_with_the_protocols_parameters(cls):
    for name, f in _methods(Executor).items():
        impl = getattr(cls, name, None)
        assert callable(impl), f"{cls.__name__}.{name} is missing"
        assert _params(impl) == _params(f), f"{cls.__name__}.{name}{inspect.signature(impl)} differs from the protocol"
    missing = set(Executor.__annotations__) - _assigned(cls)
    assert missing == set(), f"{cls.__name__} never sets {sorted(missing)}"


@pytest.mark.parametrize("cls", [Policy, RemotePolicy])
def test_each_executors_policy_saves_and_loads_adapters_alike(cls):
    for name, f in _methods(AdapterHolder).items():
        assert _params(getattr(cls, name)) == _params(f), f"{cls.__name__}.{name}"


def test_the_local_executors_no_ops():
    ex = LocalExecutor()
    with ex.sample_with(3):  # never samples ahead: nothing changes
        pass
    assert ex.settle({"policy/loss": 0.0}) is None and ex.dead_workers() == [] and ex.problems(None) == []
    assert (ex.pipelined, ex.heals) == (False, False)


def test_a_ray_executors_saved_adapter_is_the_version_asked_for(tmp_path):
    from rlkit.sync import ADAPTER_CONFIG, ADAPTER_META, ADAPTER_WEIGHTS, version_dir

    run = RayExecutor.__new__(RayExecutor)
    run.sync_root, run.published_version = tmp_path / "sync", 3
    for v in (2, 3):
        d = version_dir(run.sync_root, v)
        d.mkdir(parents=True)
        for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS, ADAPTER_META):
            (d / name).write_text(f'{{"version": {v}}}' if name == ADAPTER_META else str(v))
    policy = RemotePolicy(run)
    for asked, expected in ((None, "3"), (2, "2"), (3, "3")):
        out = tmp_path / f"adapter_{asked}"
        try:
            policy.save_adapter(out, version=asked)
        except Exception:  # noqa: BLE001 - read_adapter_info of a fake adapter: the copy is what is checked
            pass
        assert (out / ADAPTER_WEIGHTS).read_text() == expected
    with pytest.raises(RuntimeError, match="adapter version 1 is not published"):
        policy.save_adapter(tmp_path / "adapter_1", version=1)


@pytest.mark.slow  # about 80 s on a shared 2-core CPU (the Ray start is most of it)
def test_a_2_step_smoke_run_gives_the_same_metrics_on_both_executors(tmp_path):
    """backend=native (LocalExecutor) and backend=native_ray (RayExecutor, one rank, one rollout worker) from the same
    warm start: every metric both log is equal at every step, timings aside (Ray adds sync/*, the adapter's way to
    the workers, and the update's policy/shared_prefix_fraction)."""
    import json

    from tests.distributed.test_train_native_ray import _run

    rows = {}
    for backend in ("native", "native_ray"):
        out = tmp_path / backend
        _run([f"backend={backend}", "experiment=smoke", "logger=console", f"hydra.run.dir={out}"], tmp_path)
        rows[backend] = [{k: v for k, v in json.loads(line).items()
                          if not k.startswith("timing/") and k != "trainer/wall_time_s"}
                         for line in (out / "metrics.jsonl").read_text().splitlines()]
    local, ray = rows["native"], rows["native_ray"]
    assert [r["step"] for r in local] == [r["step"] for r in ray] == [0, 1, 2, 2]
    for a, b in zip(local, ray):
        common = a.keys() & b.keys()
        assert {k: a[k] for k in common} == {k: b[k] for k in common}, a["step"]
        assert set(a) - set(b) == set()
        extra = set(b) - set(a)
        assert all(k.startswith("sync/") or k == "policy/shared_prefix_fraction" for k in extra), extra
    assert {"reward/mean", "policy/loss", "policy/grad_norm", "demo/nll"} <= local[1].keys() & ray[1].keys()
