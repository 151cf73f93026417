import sys

from agent_sandbox.surfaces.gateway.cli import main

sys.exit(main())
