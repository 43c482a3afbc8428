"""conf/compat.yaml: how the config of a checkpoint written by an earlier rlkit is read (keys added, renamed and
removed since), for resume and the warm-start cache keys."""

from __future__ import annotations

from typing import Any

from rlkit.config.conf_dir import CONF_DIR

#: conf/compat.yaml, loaded as plain dicts (``compat_table``).
COMPAT_FILE = CONF_DIR / "compat.yaml"


def compat_table(section: str) -> dict[str, Any]:
    """One section of conf/compat.yaml (``added``, ``renamed``, ``renamed_one_phase``, ``removed``,
    ``grounding_key``) as a dict. Raises: OSError when the file is missing (it ships with rlkit)."""
    import yaml

    return dict((yaml.safe_load(COMPAT_FILE.read_text()) or {}).get(section) or {})


#: Keys added after checkpoints existed, with the value that does what runs did before (conf/compat.yaml).
KEYS_ADDED_LATER: dict[str, Any] = compat_table("added")
