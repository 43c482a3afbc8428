"""rlkit.evaluation.evaluate with a scripted engine: the metrics are exact functions of the answers."""

from __future__ import annotations

from envs.visgym.episode import solution_actions
from envs.visgym.parsers import make_parser


class ScriptedEngine:
    """Answers prompt i of each call with texts[i % len(texts)] (token ids: the policy's encoding)."""

    def __init__(self, policy, texts):
        self.policy, self.texts = policy, texts

    def generate(self, prompts, sampling):
        from rlkit.policy.engine import Completion

        out = []
        for i, _ in enumerate(prompts):
            text = self.texts[i % len(self.texts)]
            ids = self.policy.chat.completion_ids(text)
            out.append([Completion(token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop")
                        for _ in range(sampling.n)])
        return out


def test_success_and_distinct_outputs_follow_the_answers(policy, plan_env):
    from rlkit.evaluation import evaluate
    from rlkit.policy import SamplingParams

    seeds = [0, 1, 2, 3]
    fmt = make_parser("plan")
    solved = fmt.format(solution_actions("easy", 0))  # solves seed 0 only (the 4 mazes differ)
    assert len({fmt.format(solution_actions("easy", s)) for s in seeds}) == 4
    greedy = SamplingParams(temperature=0.0, max_new_tokens=48, n=1, seed=0)

    same = ScriptedEngine(policy, [solved])
    m, per_task, _ = evaluate(plan_env, policy, same, seeds, greedy, policy_version=0)
    assert m["eval/success_rate"] == 0.25 and [r["success"] for r in per_task] == [True, False, False, False]
    assert m["eval/distinct_outputs"] == 0.25  # one answer for 4 mazes

    per_maze = ScriptedEngine(policy, [fmt.format(solution_actions("easy", s)) for s in seeds])
    m, per_task, _ = evaluate(plan_env, policy, per_maze, seeds, greedy, policy_version=0)
    assert m["eval/success_rate"] == 1.0 and m["eval/distinct_outputs"] == 1.0
    assert m["eval/parse_failures"] == 0.0 and m["eval/mean_turns"] == 1.0
