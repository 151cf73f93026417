"""Settings: the environment, files and defaults every part reads."""
