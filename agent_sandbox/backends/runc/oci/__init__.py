"""OCI: the runtime bundle a sandbox boots from, and image archives read into templates."""
