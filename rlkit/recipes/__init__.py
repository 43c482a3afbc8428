"""Recipes: a training job's loop, composed from its parts (rlkit.recipes.grpo) and run by an executor
(rlkit.recipes.local, rlkit.recipes.ray)."""
