"""OpenAI messages -> token ids: the server's prompt is the rollout's trajectory, token for token."""

from __future__ import annotations

import pytest

from rlkit.serve.conversation import SampledIds, Turn, build_prompt, parse_messages, remember_completion
from rlkit.serve.play import observation_message
from rlkit.serve.protocol import APIError, ChatRequest, ServeLimits
from tests.conftest import TEST_DTYPE


def _segments(mask: list[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of 1s (the sampled completions) in a loss mask."""
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


@pytest.fixture(scope="module")
def episode(base_dir, adapters):
    """One greedy 3-turn interactive rollout of adapter a: (policy, env spec, trajectory)."""
    from envs.visgym import VisGymMaze
    from rlkit.policy import SamplingParams, load_policy, make_engine
    from rlkit.rollout import rollout

    policy = load_policy(name="serve_test", path=str(base_dir), device="cpu", dtype=TEST_DTYPE, lora={"rank": 4, "alpha": 8})
    policy.load_adapter(adapters["a"])
    spec = VisGymMaze(mode="interactive", max_turns=3)
    traj = rollout(spec, policy, make_engine(policy), [5], 1, SamplingParams(temperature=0, max_new_tokens=24), 0)[0]
    assert len(traj.episode.turns) == 3
    return policy, spec, traj


def _messages(spec, seed: int, texts: list[str]) -> list[dict]:
    """The OpenAI conversation play.py sends before turn len(texts) + 1."""
    env = spec.make()
    msgs = [{"role": "system", "content": env.system_prompt}, observation_message(env.reset(seed))]
    for t in texts:
        obs = env.step(t).observation
        msgs += [{"role": "assistant", "content": t}, observation_message(obs)]
    return msgs


def _turns(msgs: list[dict]) -> list[Turn]:
    return parse_messages(ChatRequest(model="m", messages=msgs).messages, ServeLimits())


def test_prompt_equals_rollout_trajectory_with_sampled_ids(episode):
    policy, spec, traj = episode
    chat = policy.chat
    segs = _segments(traj.loss_mask)
    texts = [t.action_text for t in traj.episode.turns]
    sampled = SampledIds()
    for k in range(3):
        prompt = build_prompt(chat, _turns(_messages(spec, 5, texts[:k])), sampled)
        assert prompt.input_ids == traj.input_ids[: segs[k][0]], f"turn {k + 1}: prompt != trajectory prefix"
        assert sum(int(x.image_grid_thw.prod()) for x in prompt.image_inputs) == \
            sum(int(x.image_grid_thw.prod()) for x in traj.image_inputs[: k + 1])
        remember_completion(sampled, prompt, traj.input_ids[segs[k][0]: segs[k][1]], texts[k], chat.im_end_id)
    assert sampled.hits == 0 + 1 + 2


def test_without_sampled_ids_assistant_text_is_tokenized(episode):
    policy, spec, traj = episode
    chat = policy.chat
    texts = [t.action_text for t in traj.episode.turns]
    prompt = build_prompt(chat, _turns(_messages(spec, 5, texts[:1])), None)
    first = build_prompt(chat, _turns(_messages(spec, 5, [])), None)
    n = len(first.input_ids)
    reply = chat.completion_ids(texts[0]) + chat.turn_end_ids("stop")
    assert prompt.input_ids[:n] == first.input_ids
    assert prompt.input_ids[n: n + len(reply)] == reply


def test_sampled_ids_are_keyed_by_prefix_and_bounded():
    s = SampledIds(capacity=2)
    k1, k2, k3 = (SampledIds.key([1, 2], ["d"], "x"), SampledIds.key([1, 3], ["d"], "x"),
                  SampledIds.key([1, 2], ["e"], "x"))
    assert len({k1, k2, k3}) == 3  # other ids or other images: another key
    s.put(k1, [7])
    s.put(k2, [8])
    s.put(k3, [9])
    assert s.get(k1) is None and s.get(k2) == (8,) and s.get(k3) == (9,)
    off = SampledIds(capacity=0)
    off.put(k1, [7])
    assert off.get(k1) is None


@pytest.mark.parametrize("msgs, words", [
    ([{"role": "assistant", "content": "x"}], "expected a user"),
    ([{"role": "user", "content": "x"}, {"role": "user", "content": "y"}], "expected an assistant"),
    ([{"role": "system", "content": "s"}], "last message"),
    ([{"role": "user", "content": None}], "content is required"),
])
def test_conversation_shape_errors(msgs, words):
    with pytest.raises(APIError) as info:
        _turns(msgs)
    assert info.value.status == 400 and words in info.value.message


def test_images_go_before_text_in_order(base_dir):
    from PIL import Image

    from rlkit.policy import load_policy
    from rlkit.serve.play import image_data_url

    policy = load_policy(name="serve_test", path=str(base_dir), device="cpu", dtype=TEST_DTYPE, lora={"enabled": False})
    red, blue = Image.new("RGB", (40, 40), (255, 0, 0)), Image.new("RGB", (64, 40), (0, 0, 255))
    msgs = [{"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image_url", "image_url": {"url": image_data_url(red)}},
                                         {"type": "image_url", "image_url": {"url": image_data_url(blue)}}]}]
    got = build_prompt(policy.chat, _turns(msgs), None)
    want = policy.chat.user_turn("look", [red, blue], system=None, first=True)
    assert got.input_ids == want.input_ids
    assert [tuple(x.image_grid_thw[0].tolist()) for x in got.image_inputs] == \
        [tuple(x.image_grid_thw[0].tolist()) for x in want.image_inputs]
