"""pip's own index settings (find-links, index URLs, constraints, as `pip config list` reports them) as uv flags,
one per line: uv reads neither pip.conf nor PIP_* variables. file:// locations that do not exist are left out.
Used by scripts/setup.sh and tests/test_package.py; stdlib only (runs before anything is installed).

    python scripts/pip_index_args.py     # e.g. --find-links\\n/opt/wheels\\n--extra-index-url\\nfile:///opt/pypi/simple
"""

import os
import shlex
import subprocess
import sys

FLAGS = {"find-links": "--find-links", "index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "constraint": "--constraint"}


def uv_index_args(python: str = sys.executable) -> list[str]:
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    args: list[str] = []
    seen = set()
    for line in out.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name not in FLAGS:
            continue
        for item in shlex.split(value.strip().strip("'\"")):
            path = item[len("file://"):] if item.startswith("file://") else (item if "://" not in item else None)
            if path is not None and not os.path.exists(path) or (name, item) in seen:
                continue
            seen.add((name, item))
            args += [FLAGS[name], item]
    return args


if __name__ == "__main__":
    print("\n".join(uv_index_args()))
