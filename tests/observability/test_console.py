"""Console progress: plain step lines off a terminal, silence in quiet mode, live bars on a terminal
that end with the final evaluation, nothing per token."""

from __future__ import annotations

import io
import re

from rich.console import Console

from rlkit.console import Progress

M = {"reward/mean": 0.25, "reward/success_rate": 0.5, "policy/loss": -0.01, "policy/approx_kl": 0.002,
     "policy/clip_ratio": 0.03, "generate/mean_tokens": 20, "timing/step": 1.5, "timing/rollout": 1.0,
     "timing/train": 0.4}


def test_plain_lines_off_a_terminal(capsys):
    p = Progress(quiet=False, live=False)
    p.say("setup 3s")
    with p.phase("eval", step=0, total=2, detail="4 tasks"):
        pass
    p.step(1, 2, M)
    p.step(2, 2, {**M, "eval/success_rate": 0.75})
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "[rlkit] setup 3s"
    assert re.match(r"\[rlkit\] step 1/2 \| reward 0\.250 \| success 50\.0% \| loss -0\.0100 \| kl 0\.0020 \| "
                    r"clip 0\.030 \| tokens 20 \| 1\.5s \(rollout 1\.0s, update 0\.4s\) \| ETA \dm\d\ds$", lines[1]), lines[1]
    assert lines[2].endswith("EVAL 75.0%")
    assert len(lines) == 3 and "\x1b" not in out  # one line per step, no escape codes
    assert "eval" in p.phase_seconds


def test_quiet_prints_only_say_lines(capsys):
    p = Progress(quiet=True)
    p.step(1, 2, M)
    p.sft(25, 100, 0.5, 0.1)
    with p.phase("eval", step=2, total=2):
        pass
    p.say("done")
    assert capsys.readouterr().out == "[rlkit] done\n"


def test_sft_lines_every_25_steps(capsys):
    p = Progress(live=False)
    for s in range(1, 61):
        p.sft(s, 60, 1.0 / s, None if s < 50 else 0.125)  # the first check is at step 50
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("|")[0].strip() for ln in lines] == [
        "[rlkit] sft step 25/60", "[rlkit] sft step 50/60", "[rlkit] sft step 60/60"]
    assert [ln.split("|")[-1].strip() for ln in lines] == ["val success -", "val success 12.5%", "val success 12.5%"]


def test_live_display_on_a_terminal_closes_after_the_final_eval():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=140, color_system=None)
    p = Progress(quiet=False, console=console)
    assert p.live_enabled
    p.sft(1, 2, 0.9, 0.0)
    p.say("SFT warm start: 2 steps")
    with p.phase("eval", step=0, total=2, detail="4 tasks"):
        assert p._live is not None and Progress._active is p
    p.step(1, 2, M)
    p.step(2, 2, M)
    with p.phase("eval", step=2, total=2, detail="4 tasks"):
        pass
    assert p._live is None and Progress._active is None  # closed by the final eval
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    assert "[rlkit] step 1/2" in text and "[rlkit] step 2/2" in text
    assert "train" in text and "2/2" in text  # the bar was drawn at least once


def test_a_new_job_closes_the_previous_live_display():
    c1 = Console(file=io.StringIO(), force_terminal=True)
    c2 = Console(file=io.StringIO(), force_terminal=True)
    a, b = Progress(console=c1), Progress(console=c2)
    with a.phase("eval", step=0, total=3):
        pass
    assert Progress._active is a
    with b.phase("eval", step=0, total=3):
        pass
    assert Progress._active is b and a._live is None
    b.close()
    assert Progress._active is None


def test_a_step_without_a_policy_loss_says_so_and_demos_show(capsys):
    # a demonstrations-only (or skipped) update logs no policy/loss: the line must not print a 0 loss
    p = Progress(quiet=False, live=False)
    m = {k: v for k, v in M.items() if k != "policy/loss"}
    p.step(1, 2, {**m, "dynamic/informative_groups": 5.0, "demo/tasks": 3.0})
    line = capsys.readouterr().out.splitlines()[0]
    assert "| loss - |" in line and "+0.0000" not in line, line
    assert "| success 50.0% | demos 3 | loss - |" in line, line


def test_a_pipelined_step_shows_its_update_beside_the_sampling_ahead(capsys):
    # backend.one_step_off_policy: the step's rollout happened during the previous step; timing/train is
    # only the wait after sampling ahead, so the line shows the trainer's update and the sampling it overlapped
    p = Progress(quiet=False, live=False)
    p.step(1, 2, {**M, "timing/update": 0.9, "timing/prefetch": 0.6, "timing/train": 0.3})
    p.step(2, 2, {**M, "timing/update": 0.9, "timing/prefetch": 0.0})  # the last step samples nothing ahead
    first, last = capsys.readouterr().out.splitlines()
    assert "| 1.5s (update 0.9s while sampling ahead 0.6s) |" in first, first
    assert "| 1.5s (rollout 1.0s, update 0.4s) |" in last, last


def test_lines_reach_the_log_file_once_and_not_the_console_handler(tmp_path, capsys):
    import logging

    root = logging.getLogger()
    file_handler = logging.FileHandler(tmp_path / "train.log")
    file_handler.setFormatter(logging.Formatter("[%(name)s][%(levelname)s] - %(message)s"))
    stream = io.StringIO()
    console_handler = logging.StreamHandler(stream)  # Hydra's console handler: must not repeat the lines
    root.addHandler(file_handler)
    root.addHandler(console_handler)
    try:
        p = Progress(live=False)
        p.say("setup 3s")
        p.step(1, 2, M)
        buf = io.StringIO()  # on a terminal the sft stage is a bar, but its lines every 25 steps still reach the file
        live = Progress(console=Console(file=buf, force_terminal=True, width=120, color_system=None))
        for s in (24, 25, 26):
            live.sft(s, 100, 0.5, None)
        live.close()
    finally:
        root.removeHandler(file_handler)
        root.removeHandler(console_handler)
        file_handler.close()
    lines = (tmp_path / "train.log").read_text().splitlines()
    assert lines[0] == "[rlkit][INFO] - setup 3s"
    assert lines[1].startswith("[rlkit][INFO] - step 1/2 | reward 0.250")
    assert lines[2:] == ["[rlkit][INFO] - sft step 25/100 | loss 0.5000 | val success -"]
    assert stream.getvalue() == ""
    assert capsys.readouterr().out.count("[rlkit] step 1/2") == 1
