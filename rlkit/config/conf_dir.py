"""Where rlkit's config folder is (``CONF_DIR``): the package's ``rlkit/conf`` or the checkout's conf/."""

from __future__ import annotations

from pathlib import Path


def _conf_dir() -> Path:
    """rlkit's config folder: ``rlkit/conf`` (in a checkout a link to the repository's conf/; in an installed wheel
    the copy it carries as package data), else the checkout's conf/ itself (a checkout without the link, e.g. on a
    file system without symbolic links). The package's own comes first, so an installed rlkit never reads a
    ``conf/`` some other package left beside it in site-packages."""
    here = Path(__file__).resolve().parent.parent  # rlkit/ (this file is rlkit/config/conf_dir.py)
    for cand in (here / "conf", here.parent / "conf"):
        if (cand / "train.yaml").is_file():
            return cand
    return here / "conf"


#: The folder of conf/train.yaml and its groups, for ``python train.py`` in a checkout and ``rlkit-train`` from an
#: installed wheel alike (rlkit.train's Hydra app, rlkit.plugins' compose outside a job).
CONF_DIR = _conf_dir()
