"""Vendored test files are run by the modules that load them, not collected here."""

collect_ignore_glob = ["*"]
