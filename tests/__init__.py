"""The suite. ROOT is the repository, whichever folder a test module sits in."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
