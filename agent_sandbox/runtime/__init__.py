"""Host side of the embedded engine: templates, root filesystems, OCI bundles, runc."""
