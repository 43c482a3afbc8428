"""rlkit's Hydra launcher plugins (Ray Jobs, HyperPod). Hydra imports every module of this package
while scanning the ``hydra_plugins`` namespace; the logic lives in ``launchers/``."""
