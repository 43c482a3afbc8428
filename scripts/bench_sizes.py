"""Model sizes shared by the benchmarks (no torch import: the TRL worker of bench_vs_trl.py reads them
before it sets its thread count)."""

#: issue 15's measured workload: text 256 x 4 layers (head_dim 64), vision 128 x 2, patch 16, so a
#: 224x224 image is 49 image tokens (159-token prompt).
ISSUE15_SIZES = dict(
    text_hidden=256, text_layers=4, text_heads=4, text_kv_heads=2, head_dim=64, text_intermediate=768,
    vision_hidden=128, vision_depth=2, vision_heads=2, vision_intermediate=256, patch_size=16,
    image_min_pixels=224 * 224, image_max_pixels=224 * 224,
)
