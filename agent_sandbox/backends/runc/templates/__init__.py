"""Templates: read-only root filesystems and the metadata sandboxes start from."""
