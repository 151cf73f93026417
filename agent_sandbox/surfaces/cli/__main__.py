"""``python -m agent_sandbox.surfaces.cli``: the same as the ``abx`` executable."""

from agent_sandbox.surfaces.cli.main import main

if __name__ == "__main__":
    main(prog_name="abx")
