"""The contract: what a sandbox is, whoever runs it and whoever asks."""
