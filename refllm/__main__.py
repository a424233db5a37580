"""python -m refllm: the command line."""

import sys

from refllm.cli import main

sys.exit(main())
