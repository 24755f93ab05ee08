"""`python -m pipelines.train`: the reference GRPO trainer; the code is `pipelines.reference.trainer`."""

import sys

from pipelines.reference.trainer import main

if __name__ == "__main__":
    sys.exit(main())
