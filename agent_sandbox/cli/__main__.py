"""``python -m agent_sandbox.cli``: the same as the ``abx`` executable."""

from agent_sandbox.cli.main import app

if __name__ == "__main__":
    app(prog_name="abx")
