"""How this host runs sandboxes: root or rootless, ids, mounts."""
