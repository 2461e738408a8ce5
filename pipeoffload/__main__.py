import sys

from pipeoffload.cli import main

sys.exit(main())
