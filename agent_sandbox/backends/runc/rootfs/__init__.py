"""A sandbox's root filesystem: overlays over template layers, its disk, confined access."""
