"""`python -m hooks.cli`: the same as the `gpuclass-hooks` command."""

import sys

from hooks.cli import main

sys.exit(main())
