"""Hold out by task, not by seed (issue 75 item 5): the guide's worked example (docs/adding-an-env.md, the colours
env, run from the page's own code block) and envs/shapes keep every training draw off the evaluation *tasks*, and
the numbers the guide gives for a seed-range holdout are what it would leak."""

from __future__ import annotations

import re
import types
from pathlib import Path

from envs.shapes import ShapesEnv
from rlkit.env_check import check_env
from rlkit.tasks import TaskSampler

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "adding-an-env.md"


def _colours_module() -> types.ModuleType:
    code = re.search(r"```python\n(\"\"\"Colours:.*?)```", GUIDE.read_text(), re.S).group(1)
    mod = types.ModuleType("colours_from_the_guide")
    exec(compile(code, str(GUIDE), "exec"), mod.__dict__)  # noqa: S102 - the guide's own example, from the repository
    return mod


def _leak(draws: list[int], task_of, held_out: set) -> tuple[int, int]:
    """(draws that land on an evaluation task, distinct evaluation tasks among them)."""
    hits = [task_of(s) for s in draws if task_of(s) in held_out]
    return len(hits), len(set(hits))


def test_the_guides_example_holds_out_by_task():
    m = _colours_module()
    spec = check_env(m.Colours())
    seeds = spec.eval_seeds()
    held_out = {m.task_of(s) for s in seeds}
    assert len(held_out) == len(seeds) == 32 and seeds[-1] == 33  # seeds 0..33 draw the first 32 distinct tasks
    assert all(spec.is_eval_seed(s) for s in range(34))  # the two repeats among 0..33 are held out too
    by_task = TaskSampler(0, spec.is_eval_seed).sample(1000)
    assert _leak(by_task, m.task_of, held_out) == (0, 0)
    by_seed = TaskSampler(0, lambda s: s in set(seeds)).sample(1000)  # what a seed-range holdout would train on
    assert _leak(by_seed[:100], m.task_of, held_out) == (12, 9)  # the guide's numbers
    assert _leak(by_seed, m.task_of, held_out)[1] == 30
    assert spec.demonstration(5) == [m.task_of(5)[0]]
    env = spec.make()
    env.reset(5)
    assert env.step(m.task_of(5)[0]).reward == 1.0 and env.success() is True


def test_shapes_by_seed_range_would_leak_and_by_task_does_not():
    spec = ShapesEnv()
    held_out = {spec.task_key(s) for s in spec.eval_seeds()}
    by_seed = TaskSampler(0, lambda s: 0 <= s < 64).sample(5760)
    assert _leak(by_seed[:1920], spec.task_key, held_out)[1] == 9  # docs/adding-an-env.md's numbers
    assert _leak(by_seed, spec.task_key, held_out)[1] == 24
    assert _leak(TaskSampler(0, spec.is_eval_seed).sample(5760), spec.task_key, held_out) == (0, 0)
