"""Benchmarks, GPU scripts and probes of rlkit: measurements, not product code (scripts/ holds the user tools).

Run from the checkout's root, as modules, so that the checkout's own rlkit is the one imported:

    python -m bench.bench_update --help
    bash bench/gpu_check.sh --dry-run        # the GPU scripts' shell wrappers run ``python -m bench.<name>`` too

What several of them need lives in bench/common.py; a benchmark imports that, never another benchmark. Not part of
the wheel (pyproject.toml packages rlkit, envs, rewards, launchers and hydra_plugins only).
"""
