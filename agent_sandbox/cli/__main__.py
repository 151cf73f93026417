"""``python -m agent_sandbox.cli``: the same as the ``abx`` executable."""

from agent_sandbox.cli.main import main

if __name__ == "__main__":
    main(prog_name="abx")
