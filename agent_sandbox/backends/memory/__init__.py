"""Sandboxes whose state lives in this process (``ABX_ENGINE=memory``): for tests and
development, not an isolation boundary."""
