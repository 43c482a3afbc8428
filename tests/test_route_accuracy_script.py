"""scripts/route_accuracy.py finds a run's LoRA adapter and the warm start under it from what the run saved."""

import json
import sys

import pytest

from scripts.route_accuracy import adapter_folder, main, recorded_base


def test_the_adapter_is_found_in_a_grpo_checkpoint_or_named_directly(tmp_path):
    ckpt = tmp_path / "checkpoints" / "step_000300"
    (ckpt / "adapter").mkdir(parents=True)
    (ckpt / "adapter" / "adapter_config.json").write_text("{}")
    assert adapter_folder(ckpt) == ckpt / "adapter"
    assert adapter_folder(ckpt / "adapter") == ckpt / "adapter"
    assert adapter_folder(tmp_path) is None  # a full checkpoint (a warm start): no adapter


def test_an_adapter_without_its_base_is_refused_with_the_fix(tmp_path, monkeypatch, capsys):
    (tmp_path / "adapter_config.json").write_text(json.dumps({}))
    monkeypatch.setattr(sys, "argv", ["route_accuracy.py", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2 and "names no base checkpoint: name it with --base" in capsys.readouterr().err
    (tmp_path / "rlkit_adapter.json").write_text(json.dumps({"base_model": str(tmp_path / "gone")}))
    with pytest.raises(SystemExit):
        main()
    assert f"base checkpoint {tmp_path / 'gone'} is not here" in capsys.readouterr().err


def test_the_base_is_what_the_run_recorded(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/peft/base"}))
    assert recorded_base(tmp_path) == "/peft/base"  # peft's record where rlkit's is missing
    (tmp_path / "rlkit_adapter.json").write_text(json.dumps({"base_model": "/rlkit/base", "version": 3}))
    assert recorded_base(tmp_path) == "/rlkit/base"
