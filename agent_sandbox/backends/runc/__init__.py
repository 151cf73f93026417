"""Sandboxes as runc containers on this host (as root, or as an ordinary user)."""
