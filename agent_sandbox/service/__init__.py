"""The sandbox service: the Provider, once, over a backend."""
