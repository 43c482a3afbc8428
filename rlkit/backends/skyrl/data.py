"""The task datasets of a SkyRL job, in the prompt-dataset format SkyRL reads.

SkyRL's ``PromptDataset`` loads ``.parquet`` or ``.json``/``.jsonl`` files with the Hugging Face
``datasets`` library; each row needs ``prompt`` (OpenAI chat messages) and ``env_class``; every other
column reaches the env as ``extras`` (skyrl/train/dataset/dataset.py), and ``data_source`` names the
row's dataset in SkyRL's per-dataset eval metrics (``eval/<data_source>/...``).

One row per task seed (JSON lines, one file each for training and evaluation):

    {"prompt": [{"role": "user", "content": "<env> task seed 17"}],
     "env_class": "rlkit-rewarded",
     "data_source": "visgym_easy_64",        # the eval set's name; "<name>_train" for training rows
     "seed": 17,
     "rlkit_task": "{\"register\": \"rlkit.backends.skyrl.env_adapter:register\", \"env_id\": \"rlkit-env\",
                     \"target\": \"envs.visgym.VisGymMaze\", \"env\": {...}, \"reward\": {\"_target_\": ...}}"}

The prompt is a placeholder: the env's ``init`` replaces it with its own messages (instructions and
the task image, which depends on the seed). Files are written atomically (temp file + rename), so a
reader never sees a partial dataset.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rlkit.backends.skyrl.compile import REWARDED_ENV_ID, TASK_KEY, SkyRLJob


def task_row(seed: int, data_source: str, task_json: str, label: str) -> dict[str, Any]:
    """One dataset row for task ``seed`` (see the module docstring)."""
    return {
        "prompt": [{"role": "user", "content": f"{label} task seed {int(seed)}"}],
        "env_class": REWARDED_ENV_ID,
        "data_source": data_source,
        "seed": int(seed),
        TASK_KEY: task_json,
    }


def dataset_rows(job: SkyRLJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, evaluation rows) of ``job``: one per training / evaluation seed."""
    task_json = json.dumps(job.task, sort_keys=True)
    label = job.task["env_id"]
    train = [task_row(s, f"{job.eval_set_name}_train", task_json, label) for s in job.train_seeds]
    evals = [task_row(s, job.eval_set_name, task_json, label) for s in job.eval_seeds]
    return train, evals


def write_jsonl(path: str | os.PathLike, rows: list[dict[str, Any]]) -> Path:
    """Write ``rows`` as JSON lines to ``path`` atomically (temp file in the same folder, fsync, rename).

    Raises: OSError (e.g. a full disk) naming the path; the previous file, if any, is left intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, f"could not write the SkyRL dataset {path}: {e.strerror or e}") from e
    return path


def write_datasets(job: SkyRLJob) -> tuple[Path, Path]:
    """Write the job's training and evaluation datasets to ``job.train_data`` / ``job.eval_data``."""
    train, evals = dataset_rows(job)
    return write_jsonl(job.train_data, train), write_jsonl(job.eval_data, evals)
