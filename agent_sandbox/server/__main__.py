import sys

from agent_sandbox.server.cli import main

sys.exit(main())
