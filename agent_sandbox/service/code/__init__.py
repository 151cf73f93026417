"""The code interpreter: Jupyter kernels inside sandboxes, driven from the host."""
