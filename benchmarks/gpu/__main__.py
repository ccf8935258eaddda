"""`python benchmarks/gpu [flags]` (gpu/cli.py's main; `--help` lists the flags)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# run as a folder, Python puts the folder itself first on sys.path, where its modules (data, report, ...) would pass
# for top-level ones: the package is imported from benchmarks/ instead
sys.path[:] = [p for p in sys.path if Path(p).resolve() != HERE]
sys.path.insert(0, str(HERE.parent))

from gpu.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
